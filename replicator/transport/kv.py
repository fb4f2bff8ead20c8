"""JetStream KV buckets as the limiter state and the leader election use them: created with three
replicas where the cluster has room, written with compare-and-set on the key's last sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
from nats.js import api

from replicator.transport.jetstream import PublishError

if TYPE_CHECKING:
    from nats.js import JetStreamContext

EXPECT_LAST = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
"""The compare-and-set header: the write lands only if the key's last revision is this one."""
WRONG_LAST_SEQUENCE = (10071, 10164)
"""Someone else wrote the key since we read it."""
NO_ROOM_FOR_REPLICAS = (10074, 10005, 10023)
"""Three replicas cannot be placed: not clustered (10074), too few peers (10005), no room (10023)."""
STREAM_NAME_IN_USE = 10058
MALFORMED_REQUEST = (10003, 10025)
"""The server could not read the request (bad request, invalid JSON): built wrong here, a bug."""

UNREACHABLE: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,  # and its flush and drain timeouts
    nats.errors.NoRespondersError,  # no server answers the bucket's subjects (JetStream off, stream lost)
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,  # and an unexpected EOF
    nats.errors.OutboundBufferLimitError,  # reconnecting, with the pending buffer full
    nats.errors.NoServersError,
    nats.js.errors.APIError,  # JetStream refused: unavailable, no room, the stream gone (but see `unreachable`)
    nats.js.errors.NoStreamResponseError,
    PublishError,  # a grouped publish refused or never sent (`transport/grouped.py`)
    TimeoutError,  # asyncio's wait_for
    OSError,  # the socket: refused, reset, TLS
)
"""What a KV operation raises when the server, the bucket or the way to them fails: the caller
degrades and retries later. Catch these, then ask `unreachable`; anything else is a bug and must
propagate, so that it is seen as one and not taken for an outage."""


def unreachable(err: BaseException) -> bool:
    """True when `err` (one of `UNREACHABLE`) says the KV cannot serve us now; False for a request
    the server could not read, which only a bug here builds."""
    if isinstance(err, nats.js.errors.APIError):
        return err.err_code not in MALFORMED_REQUEST
    if isinstance(err, PublishError):
        return err.code not in MALFORMED_REQUEST
    return isinstance(err, UNREACHABLE)


async def find_or_create_bucket(js: JetStreamContext, bucket: str, *, ttl: float,
                                description: str) -> tuple[api.StreamInfo, bool]:
    """The bucket's stream info, and whether it already existed (its settings may differ from ours).

    A history-1 bucket, three replicas when the cluster has room, else one; a bucket created
    concurrently by another process counts as existing."""
    stream = f"KV_{bucket}"
    try:
        return await js.stream_info(stream), True
    except nats.js.errors.NotFoundError:
        pass
    for replicas in (3, 1):
        try:
            await js.create_key_value(bucket=bucket, history=1, ttl=ttl, replicas=replicas, description=description)
            return await js.stream_info(stream), False
        except nats.js.errors.APIError as err:
            if err.err_code == STREAM_NAME_IN_USE:
                return await js.stream_info(stream), True
            if replicas == 1 or err.err_code not in NO_ROOM_FOR_REPLICAS:
                raise
    raise AssertionError("unreachable")
