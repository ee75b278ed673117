"""Checks of the replay buffer's arguments and of the rollouts it reads, so that a value of
the wrong kind is a ``ValueError`` naming the parameter (or the rollout and its field)
when it is given, not a ``TypeError`` deep inside numpy later, a silent truncation
(``int(1.9)``), or a NaN that poisons a whole group's advantages."""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def integer(value: Any) -> Optional[int]:
    """``value`` as an int if it is one (an int, a numpy integer, anything with
    ``__index__``), else None: never a bool, and never a float, which ``int()`` would
    truncate."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def real(value: Any) -> Optional[float]:
    """``value`` as a float if it is a real number (a Python or numpy number, a 0-d
    array), else None: never a bool, a complex, a string (``float("1.0")`` would take it),
    None or an array of several values."""
    if value is None or isinstance(value, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        # A numpy complex converts, to its real part with only a warning.
        return None
    if isinstance(value, np.ndarray) and (value.ndim or value.dtype.kind not in "iuf"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def count(name: str, value: Any, least: Optional[int] = None, int64: bool = False) -> int:
    """An int parameter, at least ``least`` if given, and within int64 if asked."""
    v = integer(value)
    if v is None or (least is not None and v < least) or (int64 and not INT64_MIN <= v <= INT64_MAX):
        rule = "an int" if least is None else f"an int >= {least}"
        if int64:
            rule += " that fits int64"
        raise ValueError(f"{name} must be {rule}, not {value!r}")
    return v


def number(name: str, value: Any, positive: bool = False, inf_ok: bool = False) -> float:
    """A real parameter: never NaN; infinite only if ``inf_ok``; > 0 if ``positive``."""
    v = real(value)
    if v is None or math.isnan(v) or (math.isinf(v) and not inf_ok) or (positive and not v > 0):
        rule = "a number > 0" if positive else "a number"
        rule += "" if inf_ok else " (finite)"
        raise ValueError(f"{name} must be {rule}, not {value!r}")
    return v


def flag(name: str, value: Any) -> bool:
    """A bool parameter (``bool("no")`` is True, so nothing else is taken)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, not {value!r}")
    return bool(value)


def timeout(value: Any) -> Optional[float]:
    """A wait in seconds: None or infinity waits without end (None for the wait), a
    negative one not at all; NaN (which waited forever, never passing the deadline) and
    anything but a number are refused."""
    if value is None:
        return None
    v = real(value)
    if v is None or math.isnan(v):
        raise ValueError(f"timeout must be a number of seconds or None, not {value!r}")
    return None if math.isinf(v) and v > 0 else v
