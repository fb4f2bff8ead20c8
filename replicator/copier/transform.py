"""Source message -> target subject, header block and payload, all as bytes on the way through."""

from __future__ import annotations

from typing import Final

from replicator.copier.endpoints import Endpoints
from replicator.copier.headers import HeaderPolicy, TargetFeatures
from replicator.copier.provenance import CHORIA_SOURCE, EXPECTED_LAST_MSG_ID, MSG_ID, PROVENANCE, Writer
from replicator.transport.header_block import HeaderView
from replicator.transport.subjects import SubjectRewriter
from replicator.transport.wire import RawMsg

_CHAIN: Final = EXPECTED_LAST_MSG_ID.encode() + b": "
_PROV: Final = PROVENANCE.encode()
_ID: Final = MSG_ID.encode()
_CHORIA: Final = CHORIA_SOURCE.encode()


class Copy:
    """What is published to the target for one source message (a plain class: see `window.Entry`)."""

    __slots__ = ("chainable", "head", "msg_id", "payload", "subject")

    def __init__(self, subject: str, head: bytes, msg_id: bytes, payload: bytes, chainable: bool) -> None:
        self.subject = subject
        self.head = head  # the header block without its closing line: policy applied, provenance and id added
        self.msg_id = msg_id  # this copy's Nats-Msg-Id
        self.payload = payload
        self.chainable = chainable  # may carry the ordered chain's Nats-Expected-Last-Msg-Id

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
        self.policy = HeaderPolicy()
        go = ep.profile.go  # a Go-format profile's copies also carry the Go tool's header
        self.choria = (go.replicator, go.name) if go is not None else None
        self.writer = Writer(ep.source_stream, ep.profile.base_name, "")
        self.set_writer("")

    def set_writer(self, identity: str) -> None:
        """The source stream instance this copier reads (see `provenance.stream_identity`)."""
        self.writer = Writer(self.writer.source_stream, self.writer.name, identity)
        # This hop's lines, `Writer.provenance` and `Writer.msg_id` as templates around the numbers.
        wid = self.writer.id.encode()
        self._prov = b"%s: %s " % (_PROV, self.writer.source_stream.encode())
        self._name = b" %s " % self.writer.name.encode()
        self._wid = wid
        instance = b" " + identity.encode() if identity else b""
        self._tail = b" %s%s\r\n%s: " % (wid, instance, _ID)
        self._choria = self._choria_name = b""
        if self.choria is not None:
            self._choria = b"%s: %s " % (_CHORIA, self.writer.source_stream.encode())
            self._choria_name = b" %s %s " % (self.choria[0].encode(), self.choria[1].encode())

    def set_features(self, features: TargetFeatures) -> None:
        self.policy = HeaderPolicy(features)

    def build(self, msg: RawMsg, seq: int, ts_ns: int) -> Copy:
        applied = self.policy.apply_block(msg.hdr)
        msg_id = b"%s:%d" % (self._wid, seq)
        head = b"%s%s%d%s%d%s%s\r\n" % (applied.head, self._prov, seq, self._name, ts_ns // 1_000_000, self._tail,
                                         msg_id)
        if self._choria:  # `<stream> <seq> <replicator> <name> <ms>`, as parse_choria_source reads it
            head += b"%s%d%s%d\r\n" % (self._choria, seq, self._choria_name, ts_ns // 1_000_000)
        return Copy(self.rewrite(msg.subject), head, msg_id, b"" if applied.empty_payload else msg.data,
                    applied.chainable)
