"""The deterministic draw order: a seeded round-robin over examples.

Every group carries a stable 64-bit hash of its id and of its example. For a seed, each
group gets a key ``-ln(u) / w`` (``u`` uniform from the seed and the group's hash, ``w``
its recency weight: a weighted shuffle without replacement, Efraimidis-Spirakis); each
example's groups are ranked by key, the examples are shuffled by the seed, and the order is
round 0 of every example, then round 1, and so on. An example with many ready groups
therefore takes one place per round, like any other. Nothing here depends on arrival order
or on the process: the same ready set and seed give the same order after a restart.
"""

from __future__ import annotations

import re

import hashlib
from typing import Optional

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def check_int(name: str, value: object, least: Optional[int] = None) -> int:
    """A seed, an offset, a step or a count as an int: an int or a numpy integer, not a
    bool (nor a float, which ``int()`` would truncate), and at least ``least`` if given.
    The draw masks and wraps it, which a float failed inside with a TypeError naming
    neither (and a negative numpy integer with an OverflowError)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or (least is not None and value < least)
    ):
        rule = "an int" if least is None else f"an int >= {least}"
        raise ValueError(f"{name} must be {rule}, not {value!r}")
    return int(value)


def version_set(name: str, values: object, numeric: bool = False) -> set:
    """Policy versions given as a list (any iterable but a string) of ints, numpy integers
    or strings, as the strings the buffer keys versions by. A string was read character
    by character ("12": versions 1 and 2) and a float as its text (3.0: "3.0", matching no
    version), both silently."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a list of policy versions, not {values!r}")
    out = set()
    for v in values:
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out.add(str(int(v)))
        elif isinstance(v, str) and v:
            # As the buffer stores versions with `numeric_versions`: "03" is "3".
            out.add(str(int(v)) if numeric and _INTEGER.match(v) else v)
        else:
            raise ValueError(f"{name}: a policy version is an int or a non-empty string, not {v!r}")
    return out


# An integer's text, as the buffer checks a numeric version (ASCII digits only).
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def stable_hash(text: str) -> int:
    """64 bits of blake2b: stable across processes (unlike ``hash``)."""
    # Surrogates pass (valid text encodes the same): the sharded front routes a record
    # with a lone surrogate to the shard whose check names it, not a UnicodeEncodeError.
    data = text.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _uniform(h: np.ndarray, seed: int) -> np.ndarray:
    """A uniform in (0, 1] per hash, from the seed."""
    s = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64))[0]
    bits = _mix(h ^ s) >> np.uint64(11)
    return (bits.astype(np.float64) + 1.0) / float(1 << 53)


def round_robin(
    group_hashes: np.ndarray,
    example_hashes: np.ndarray,
    seed: int,
    weights: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Positions into the inputs, in draw order (see the module docs)."""
    n = len(group_hashes)
    if n == 0:
        return np.zeros(0, np.int64)
    key = -np.log(_uniform(group_hashes, seed))
    if weights is not None:
        key = key / weights
    # Rank within each example by key (ties by group hash, so the order is total).
    by_example = np.lexsort((group_hashes, key, example_hashes))
    sorted_ex = example_hashes[by_example]
    starts = np.flatnonzero(np.r_[True, sorted_ex[1:] != sorted_ex[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    rank = np.empty(n, np.int64)
    rank[by_example] = np.arange(n) - run_start
    example_order = _mix(example_hashes ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    return np.lexsort((group_hashes, example_order, rank))


def recency_weights(lags: np.ndarray, mode: str) -> Optional[np.ndarray]:
    """Weights by policy lag: ``uniform`` (none), ``linear`` (``1 / (1 + lag)``) or
    ``exp`` (``2 ** -lag``)."""
    if mode == "uniform":
        return None
    lags = np.maximum(lags.astype(np.float64), 0.0)
    if mode == "linear":
        return 1.0 / (1.0 + lags)
    if mode == "exp":
        return np.exp2(-lags)
    raise ValueError(f"recency_weighting must be 'uniform', 'linear' or 'exp', not {mode!r}")


def window(order: list, start_offset: int, n: int) -> list:
    """Positions ``start_offset .. start_offset + n`` of ``order``, wrapping; all of it
    when it holds fewer than ``n``."""
    if n <= 0 or not order:
        return []
    if len(order) <= n:
        return list(order)
    k = start_offset % len(order)
    return [order[(k + i) % len(order)] for i in range(n)]
