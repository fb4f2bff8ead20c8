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


# The Go Stream Replicator's durations (`util.ParseDurationString`): the last character picks the
# parser. `d`/`D`, `w`/`W`, `M` (30 days) and `Y`/`y` (365 days) take one decimal number; anything
# ending in `s`, `m`, `h` or `H` is Go's `time.ParseDuration` (`1h30m`, `500ms`, `1.5h`).
_GO_DAYS = {"d": 1.0, "D": 1.0, "w": 7.0, "W": 7.0, "M": 30.0, "Y": 365.0, "y": 365.0}
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(value: object) -> float:
    """Seconds from a Go-format duration (`10s`, `1h30m`, `500ms`, `1d`, `1w`, `1M`, `1Y`); 0 for ""."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid duration {value!r}")
    text = str(value).strip()
    if not text:
        return 0.0
    unit = text[-1]
    if unit in _GO_DAYS:
        try:
            number = float(text[:-1])
        except ValueError:
            raise ValueError(f"invalid duration {value!r} (use e.g. 10s, 5m, 1h30m, 1d, 1w, 1M or 1Y)") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"invalid duration {value!r}: must be a positive number")
        return number * _GO_DAYS[unit] * 86400.0
    if unit not in "smhH":
        raise ValueError(f"invalid duration {value!r}: invalid time unit {unit!r} "
                         "(use e.g. 10s, 5m, 1h30m, 1d, 1w, 1M or 1Y)")
    body = text[:-1] + "h" if unit == "H" else text
    pos, total = 0, 0.0
    for match in _GO_PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(body):
        raise ValueError(f"invalid duration {value!r} (use e.g. 10s, 5m, 1h30m, 1d, 1w, 1M or 1Y)")
    return total
