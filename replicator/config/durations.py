"""Durations as the legacy config wrote them: `10s`, `5m`, `1h`, `1d`, combined (`1h30m`) or bare seconds."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: object) -> float:
    """Seconds from a duration; raises ValueError with the accepted forms."""
    try:
        seconds = _parse(value)
    except OverflowError:
        raise ValueError(f"invalid duration {value!r}: too large") from None
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: must be finite")
    return seconds


def _parse(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"invalid duration {value!r} (use e.g. 10s, 5m, 1h, 1d or 1h30m)")
    return total


def format_duration(seconds: float) -> str:
    """The shortest exact unit form, for configs the operator writes."""
    whole = int(seconds)
    if whole != seconds:
        return f"{int(seconds * 1000)}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"
