"""The limiter's KV bucket as a whole: found or created with a TTL that outlives `age`, and read
in one pass (the `state` command)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from nats.js import api

from replicator.sampling.state.records import Sender, decode_key, decode_sender
from replicator.transport.header_block import HeaderView
from replicator.transport.jetstream import nothing_sent
from replicator.transport.kv import find_or_create_bucket

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

DELETE_OPS = ("DEL", "PURGE")


def deleted(block: bytes) -> bool:
    """A KV entry's header block says the key is gone: deleted, purged, or a TTL marker."""
    if b"KV-Operation" not in block and b"Nats-Marker-Reason" not in block:
        return False  # the commonest: a compare-and-set header only
    headers = HeaderView(block)
    return headers.get("KV-Operation") in DELETE_OPS or headers.get("Nats-Marker-Reason") is not None


async def ensure_bucket(js: JetStreamContext, bucket: str, *, ttl: float, description: str) -> api.StreamInfo:
    """Find or create the limiter bucket; an existing one that forgets senders too soon is raised to `ttl`."""
    info, existed = await find_or_create_bucket(js, bucket, ttl=ttl, description=description)
    if existed and info.config.max_age and info.config.max_age < ttl:
        log.warning("KV bucket %s keeps entries %ss, raising to %ss", bucket, info.config.max_age, ttl)
        info.config.max_age = ttl
        info = await js.update_stream(info.config)
    return info


async def read_kv_state(js: JetStreamContext, bucket: str, *, wait: float = 30.0) -> dict[str, Sender]:
    """Every sender in a topic's bucket (for the `state` command): one pass of an ordered consumer."""
    out: dict[str, Sender] = {}
    done = asyncio.Event()
    prefix = f"$KV.{bucket}."

    async def on_msg(msg: Msg) -> None:
        headers = msg.headers or {}
        key = decode_key(msg.subject[len(prefix) :])
        if headers.get("KV-Operation") in DELETE_OPS or "Nats-Marker-Reason" in headers:
            out.pop(key, None)
        else:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                out[key] = decode_sender(msg.data)
        if msg.metadata.num_pending == 0:
            done.set()

    sub = await js.subscribe(
        prefix + ">",
        stream=f"KV_{bucket}",
        cb=on_msg,
        ordered_consumer=True,
        # A reader killed mid-read leaves no consumer behind for longer than the threshold.
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, inactive_threshold=30.0),
    )
    try:
        if not nothing_sent(await sub.consumer_info()):
            await asyncio.wait_for(done.wait(), wait)
    finally:
        await sub.unsubscribe()
    return out
