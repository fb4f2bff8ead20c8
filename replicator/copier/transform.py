"""Source message -> target subject, header block and payload, all as bytes on the way through."""

from __future__ import annotations

from dataclasses import dataclass

from replicator.copier.endpoints import Endpoints
from replicator.copier.headers import HeaderPolicy, TargetFeatures
from replicator.copier.provenance import (
    CHORIA_SOURCE,
    EXPECTED_LAST_MSG_ID,
    MSG_ID,
    PROVENANCE,
    Writer,
    choria_source,
)
from replicator.transport.header_block import HeaderView
from replicator.transport.subjects import SubjectRewriter
from replicator.transport.wire import RawMsg

_CHAIN = EXPECTED_LAST_MSG_ID.encode() + b": "
_PROV = PROVENANCE.encode()
_ID = MSG_ID.encode()
_CHORIA = CHORIA_SOURCE.encode()


@dataclass(slots=True)
class Copy:
    """What is published to the target for one source message."""

    subject: str
    head: bytes  # the header block without its closing line: policy applied, provenance and id added
    msg_id: bytes  # this copy's Nats-Msg-Id
    payload: bytes
    chainable: bool  # may carry the ordered chain's Nats-Expected-Last-Msg-Id

    def block(self, predecessor: bytes | None = None) -> bytes:
        """The header block to send, chained to `predecessor`'s msg id (None: without the check)."""
        if predecessor is None:
            return self.head + b"\r\n"
        return b"%s%s%s\r\n\r\n" % (self.head, _CHAIN, predecessor)

    @property
    def headers(self) -> HeaderView:
        return HeaderView(self.block())


class MessageTransform:
    """The header policy (`headers.py`) applied to the source's header block, then this hop's own
    provenance and `Nats-Msg-Id` lines added (`provenance.py`); the subject rewritten."""

    def __init__(self, ep: Endpoints) -> None:
        self.rewrite = SubjectRewriter(ep.profile.settings)
        self.writer = Writer(ep.source_stream, ep.profile.base_name, "")
        self.policy = HeaderPolicy()
        go = ep.profile.go  # a Go-format profile's copies also carry the Go tool's header
        self.choria = (go.replicator, go.name) if go is not None else None

    def set_writer(self, identity: str) -> None:
        """The source stream instance this copier reads (see `provenance.stream_identity`)."""
        self.writer = Writer(self.writer.source_stream, self.writer.name, identity)

    def set_features(self, features: TargetFeatures) -> None:
        self.policy = HeaderPolicy(features)

    def build(self, msg: RawMsg, seq: int, ts_ns: int) -> Copy:
        applied = self.policy.apply_block(msg.hdr)
        writer = self.writer
        msg_id = writer.msg_id(seq).encode()
        head = b"%s%s: %s\r\n%s: %s\r\n" % (applied.head, _PROV, writer.provenance(seq, ts_ns).encode(), _ID, msg_id)
        if self.choria is not None:
            head += b"%s: %s\r\n" % (_CHORIA, choria_source(writer.source_stream, seq, *self.choria, ts_ns).encode())
        return Copy(self.rewrite(msg.subject), head, msg_id, b"" if applied.empty_payload else msg.data,
                    applied.chainable)
