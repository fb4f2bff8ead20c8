"""The provenance header every copy carries, and how resuming finds this replicator's last copy."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

PROVENANCE = "Stream-Replicator-Source"
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"


def provenance(source_stream: str, seq: int, name: str, timestamp_ns: int) -> str:
    return f"{source_stream} {seq} {name} {timestamp_ns // 1_000_000}"


@dataclass(frozen=True)
class Provenance:
    stream: str
    seq: int
    name: str
    timestamp_ms: int


def parse_provenance(value: str | None) -> Provenance | None:
    if not value:
        return None
    parts = value.split(" ")
    if len(parts) != 4:
        return None
    try:
        return Provenance(parts[0], int(parts[1]), parts[2], int(parts[3]))
    except ValueError:
        return None


async def last_copied(
    target_js: JetStreamContext, target_stream: str, last_subject: str, source_stream: str, name: str
) -> int:
    """The last source sequence this replicator landed on the target (0 if none is found)."""
    try:
        msg = await target_js.get_last_msg(target_stream, last_subject)
    except NotFoundError:
        return 0
    prov = parse_provenance((msg.headers or {}).get(PROVENANCE))
    if prov is None or prov.stream != source_stream or prov.name != name:
        return 0
    return prov.seq
