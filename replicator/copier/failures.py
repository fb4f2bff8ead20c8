"""How a failed publish is classified: a poison message, a full target, or something to retry."""

from __future__ import annotations

from replicator.transport.jetstream import (
    PERMANENT_CODES,
    STREAM_FULL_HINTS,
    PublishError,
)


def is_permanent(err: PublishError) -> bool:
    return err.code in PERMANENT_CODES or "maximum payload" in err.description.lower()


def is_target_full(err: PublishError) -> bool:
    return any(hint in err.description.lower() for hint in STREAM_FULL_HINTS)
