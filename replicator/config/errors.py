"""Config errors that name the file and the key, for exit status 2 without a traceback."""

from __future__ import annotations

from pydantic import (
    ValidationError,
)


class ConfigError(Exception):
    """A config problem a user must fix; the message names the file and the key."""


def format_loc(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join(parts)


def format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = format_loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)
