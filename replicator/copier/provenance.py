"""Who wrote a copy: the writer identity, the `Nats-Msg-Id` it dedups by, the provenance header.

A *writer* is one replication of one source stream *instance* by one replicator `name`. Stream
names repeat (every city has a `CHORIA_REGISTRATION`), config files are copied between sites, and a
deleted and re-created stream starts its sequences at 1 again: none of those may collide on a
shared target. The instance is told apart by the stream's creation time, hashed exactly as
nats-server 2.15 computes its own `Nats-Stream-Identity`; the writer id hashes stream name,
instance and replicator name into 10 characters, short because it rides on every message:

- `Nats-Msg-Id: <writer>:<stream_seq>`
- `Stream-Replicator-Source: <source_stream> <stream_seq> <name> <source_timestamp_ms> <writer> <instance>`

The last field is the source stream instance's identity (`stream_identity`): it names the place a
copy came from, so that the loop guard (`loops.py`) can refuse to copy it back there.

Copies written by the previous releases carry `<stream>:<seq>` ids and a provenance without the
writer field, or without the instance; they are still recognised when resuming (by stream and name,
as that release did).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

PROVENANCE = "Stream-Replicator-Source"
CHORIA_SOURCE = "Choria-SR-Source"
"""The Go Stream Replicator's header, `<stream> <seq> <replicator> <name> <timestamp-ms>`: added for
Go-format profiles, and read to resume after the Go tool's own last copy."""
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"

_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
WRITER_LEN = 10


def _hash(text: str, size: int) -> str:
    """nats-server's `getHashSize`: sha256, each of the first `size` bytes as one base-62 digit."""
    digest = hashlib.sha256(text.encode()).digest()
    return "".join(_DIGITS[b % 62] for b in digest[:size])


def stream_identity(created: str) -> str:
    """A stream instance's identity from its `created` time (RFC 3339, UTC, as the server sends it):
    the same 8 characters nats-server 2.15 returns as `Nats-Stream-Identity`."""
    return _hash(created, 8)


def writer_id(source_stream: str, identity: str, name: str) -> str:
    """One replication (replicator `name`) of one source stream instance."""
    return _hash(f"{source_stream}\n{identity}\n{name}", WRITER_LEN)


@dataclass(frozen=True)
class Writer:
    """What identifies this copier's messages on the target."""

    source_stream: str
    name: str
    identity: str  # the source stream instance

    @cached_property
    def id(self) -> str:
        return writer_id(self.source_stream, self.identity, self.name)

    def msg_id(self, seq: int) -> str:
        return f"{self.id}:{seq}"

    def provenance(self, seq: int, timestamp_ns: int) -> str:
        instance = f" {self.identity}" if self.identity else ""
        return f"{self.source_stream} {seq} {self.name} {timestamp_ns // 1_000_000} {self.id}{instance}"

    def owns(self, prov: Provenance | None) -> bool:
        """A copy this writer made; copies of the previous release (no writer field) are matched by
        stream and name, as that release did (callers bound those to the uncertain range)."""
        if prov is None:
            return False
        if prov.writer is None:
            return prov.stream == self.source_stream and prov.name == self.name
        return prov.writer == self.id


@dataclass(frozen=True)
class Provenance:
    stream: str
    seq: int
    name: str
    timestamp_ms: int
    writer: str | None = None  # None: written by the previous release
    instance: str | None = None  # the source stream instance's identity; None: an earlier release

    @property
    def legacy(self) -> bool:
        return self.writer is None


def parse_choria_source(value: str | None, source_stream: str, replicator: str, name: str) -> int:
    """The source sequence in a `Choria-SR-Source` header written for this stream by this
    replicator and stream name; 0 otherwise."""
    parts = (value or "").split(" ")
    if len(parts) != 5 or parts[0] != source_stream or parts[2] != replicator or parts[3] != name:
        return 0
    try:
        return max(0, int(parts[1]))
    except ValueError:
        return 0


def parse_provenance(value: str | None) -> Provenance | None:
    if not value:
        return None
    parts = value.split(" ")
    if len(parts) not in (4, 5, 6):
        return None
    try:
        return Provenance(parts[0], int(parts[1]), parts[2], int(parts[3]), parts[4] if len(parts) >= 5 else None,
                          parts[5] if len(parts) == 6 else None)
    except ValueError:
        return None
