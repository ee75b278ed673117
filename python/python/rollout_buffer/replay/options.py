"""The checks of :class:`~rollout_buffer.replay.ReplayBuffer`'s constructor arguments,
shared with the sharded front (which checks before it starts any actor): each bad one is
a ``ValueError`` naming it."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np

from . import storage
from .draw import version_set


# The options that count something: an int >= 1. A float was taken as it was (a capacity
# of 2.5 groups) and a bool as 0 or 1; a numpy uint64 would wrap `len(live) - capacity`
# below zero, so the counts are kept as Python ints. The limits may be None: no limit.
_COUNTS = ("capacity_groups", "target_group_size", "min_group_size", "flush_rows")
_LIMITS = ("max_per_replica", "max_uses_per_group", "max_groups_per_version")
# Durations: (name, 0 allowed, infinity allowed). A NaN or a negative retention evicted
# every unleased group at the next call; a NaN flush interval never flushed by time.
_SECONDS = (
    ("seal_timeout_s", False, True),  # infinity: sealed by size only
    ("lease_timeout_s", False, True),  # infinity: a lease never expires
    ("flush_interval_s", True, True),  # 0: at every call; infinity: by flush_rows only
    ("retention_ttl_s", False, True),  # None or infinity: no retention by age
)


def check_options(options: dict) -> dict:
    """Checks :class:`ReplayBuffer`'s arguments (``options``, by name): each bad one is a
    ``ValueError`` naming it. Returns the counts and limits as ints (or None). The sharded
    front checks with it before it starts any actor."""
    root = options["root_path"]
    if isinstance(root, os.PathLike):
        root = os.fspath(root)
    if not isinstance(root, str) or not root:
        raise ValueError(f"root_path must be a folder's path or a URL (s3://, gs://, ...), not {root!r}")
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):/(?!/)", root)
    if scheme:
        # `s3:/bucket` made a local folder named `s3:`.
        raise ValueError(f"root_path {root!r} is neither a path nor a URL: did you mean {scheme.group(1)}://...?")
    for name in ("numeric_versions", "durable"):
        if not isinstance(options[name], (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, not {options[name]!r}")
    if options["clock"] is not None and not callable(options["clock"]):
        raise ValueError(f"clock must be a function returning seconds (or None), not {options['clock']!r}")
    if options["grouping"] not in ("strict", "mixed"):
        raise ValueError(f"grouping must be 'strict' or 'mixed', not {options['grouping']!r}")
    counts = {}
    for name in _COUNTS + _LIMITS:
        v = options[name]
        if v is None and name in _LIMITS:
            counts[name] = None
        elif isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            no_limit = " (or None: no limit)" if name in _LIMITS else ""
            raise ValueError(f"{name} must be an int >= 1{no_limit}, not {v!r}")
        else:
            counts[name] = int(v)
    if counts["min_group_size"] > counts["target_group_size"]:
        raise ValueError(
            f"min_group_size must be in 1..target_group_size ({counts['target_group_size']}),"
            f" not {counts['min_group_size']}"
        )
    for name, zero_ok, inf_ok in _SECONDS:
        v = options[name]
        if not (v is None and name == "retention_ttl_s") and not _duration_ok(v, zero_ok, inf_ok):
            rule = f"a {'' if inf_ok else 'finite '}number of seconds {'>=' if zero_ok else '>'} 0"
            none = " (or None: no retention by age)" if name == "retention_ttl_s" else ""
            raise ValueError(f"{name} must be {rule}{none}, not {v!r}")
    # Read once, here: a generator read again in __init__ was empty, and every rollout
    # refused.
    accept = options["accept_policy_versions"]
    counts["accept_policy_versions"] = None if accept is None else version_set(
        "accept_policy_versions", accept, options["numeric_versions"])
    # Here, not at the first write (on the writer thread, long after the mistake).
    storage.check_compression(options["compression"])
    return counts


def _duration_ok(v: Any, zero_ok: bool, inf_ok: bool) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    # Comparisons, so that NaN fails both.
    return (0 <= v if zero_ok else 0 < v) and (v <= math.inf if inf_ok else v < math.inf)
