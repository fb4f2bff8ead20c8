"""Source message -> target subject, headers and payload."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg

from replicator.copier.endpoints import Endpoints
from replicator.copier.headers import HeaderPolicy, TargetFeatures
from replicator.copier.provenance import CHORIA_SOURCE, MSG_ID, PROVENANCE, Writer, choria_source
from replicator.transport.subjects import SubjectRewriter


@dataclass(slots=True)
class Copy:
    """What is published to the target for one source message."""

    subject: str
    headers: dict[str, str]
    payload: bytes
    chainable: bool  # may carry the ordered chain's Nats-Expected-Last-Msg-Id


class MessageTransform:
    """The header policy (`headers.py`) applied to the source's headers, then this hop's own
    provenance and `Nats-Msg-Id` added (`provenance.py`); the subject rewritten."""

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

    def headers(self, msg: Msg, seq: int, ts_ns: int) -> dict[str, str]:
        return self.build(msg, seq, ts_ns).headers

    def build(self, msg: Msg, seq: int, ts_ns: int) -> Copy:
        applied = self.policy.apply(msg.headers)
        headers = applied.headers
        writer = self.writer
        headers[PROVENANCE] = writer.provenance(seq, ts_ns)
        headers[MSG_ID] = writer.msg_id(seq)
        if self.choria is not None:
            headers[CHORIA_SOURCE] = choria_source(writer.source_stream, seq, *self.choria, ts_ns)
        return Copy(self.rewrite(msg.subject), headers, b"" if applied.empty_payload else msg.data,
                    applied.chainable)
