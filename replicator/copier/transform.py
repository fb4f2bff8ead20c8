"""Source message -> target subject and headers."""

from __future__ import annotations

from nats.aio.msg import Msg

from replicator.copier.endpoints import Endpoints
from replicator.copier.provenance import MSG_ID, PROVENANCE, provenance
from replicator.transport.subjects import SubjectRewriter

EXPECTED_PREFIX = "Nats-Expected-"


class MessageTransform:
    """Source message -> target subject and headers: original headers kept, provenance and msg id added.

    `Nats-Expected-*` headers are dropped: they were the publisher's conditions on the source stream
    (expected stream name, last sequence, last msg id), already enforced when the message was
    stored there. Evaluated again against the target they fail (another name, other sequences) and
    the copy could never land; the previous hop's own chain header is one of them.
    """

    def __init__(self, ep: Endpoints) -> None:
        self.rewrite = SubjectRewriter(ep.profile.settings)
        self.source_stream = ep.source_stream
        self.name = ep.profile.base_name
        self.id_prefix = f"{ep.source_stream}:"

    def headers(self, msg: Msg, seq: int, ts_ns: int) -> dict[str, str]:
        headers = dict(msg.headers) if msg.headers else {}
        if headers:
            for key in [k for k in headers if k.startswith(EXPECTED_PREFIX)]:
                del headers[key]
        headers[PROVENANCE] = provenance(self.source_stream, seq, self.name, ts_ns)
        if MSG_ID not in headers:
            headers[MSG_ID] = f"{self.id_prefix}{seq}"
        return headers
