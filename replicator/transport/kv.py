"""JetStream KV buckets as the limiter state and the leader election use them: created with three
replicas where the cluster has room, written with compare-and-set on the key's last sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING

import nats.js.errors
from nats.js import api

if TYPE_CHECKING:
    from nats.js import JetStreamContext

EXPECT_LAST = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
"""The compare-and-set header: the write lands only if the key's last revision is this one."""
WRONG_LAST_SEQUENCE = (10071, 10164)
"""Someone else wrote the key since we read it."""
NO_ROOM_FOR_REPLICAS = (10074, 10005, 10023)
"""Three replicas cannot be placed: not clustered (10074), too few peers (10005), no room (10023)."""
STREAM_NAME_IN_USE = 10058


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
