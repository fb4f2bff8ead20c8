"""An ordered push consumer read off a raw subscription: a stream's messages (a KV bucket's
entries) in order, each handed over as subject, header block, payload and stream sequence.

nats-py's ordered consumer builds a `Msg`, parses its headers (every KV entry written with a
compare-and-set carries one), queues it for a task and parses its ack subject twice: during a
fleet's cold start, when every pod's watch brings it every pod's claims and marks, that cost more
than the rest of the pod's work on them. Here the compiled parser (`wire.subscribe_raw`) hands
each delivery over as bytes, and what makes the consumer "ordered" is kept, as nats-py does it:
a gap in the consumer sequence, a heartbeat naming a later delivery than the last one seen, or
two heartbeat intervals without a word recreates the consumer from the next stream sequence, on
a new inbox. Flow control requests and stalled-consumer hints are answered at once (each
delivery is handled before the next is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from replicator.transport.errors import NATS_ERRORS
from replicator.transport.header_block import HeaderView, status
from replicator.transport.jetstream import nothing_sent
from replicator.transport.wire import (
    ACK_CONSUMER_SEQ,
    ACK_PENDING,
    ACK_STREAM_SEQ,
    ack_tokens,
    subscribe_raw,
    unsubscribe_raw,
)

log = logging.getLogger(__name__)

OnEntry = Callable[[str, "bytes | None", bytes, int, int], None]
"""subject, header block (None: none), payload, stream sequence, deliveries still pending."""


class OrderedWatch:
    """`start` once (from the last entry of each subject, or from a stream sequence), `stop` once."""

    def __init__(self, nc: Client, js: JetStreamContext, stream: str, subject: str, on_entry: OnEntry, *,
                 heartbeat: float = 2.0, timeout: float = 2.0, inactive: float = 60.0) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.subject = subject
        self.on_entry = on_entry
        self.heartbeat = heartbeat
        self.timeout = timeout
        self.inactive = inactive
        self.last_stream_seq = 0  # of the last delivery handed over
        self.resets = 0
        self._delivered = 0  # consumer sequence of the last delivery handed over
        self._active = False
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._restarting: asyncio.Task[None] | None = None

    async def start(self, from_seq: int | None) -> bool:
        """Create the consumer; True when it has nothing to deliver (an empty stream)."""
        info = await self._create(from_seq)
        self._spawn(self._watch_activity())
        return nothing_sent(info)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, *NATS_ERRORS):
                await task
        await self._unsubscribe()

    async def _create(self, from_seq: int | None) -> api.ConsumerInfo:
        """A fresh inbox and a consumer delivering to it (nats-py's ordered consumer settings)."""
        await self._unsubscribe()
        self._delivered = 0
        inbox = self.nc.new_inbox()
        self._sub = await subscribe_raw(self.nc, inbox, self._on_msg)
        config = api.ConsumerConfig(
            deliver_subject=inbox, filter_subject=self.subject, ack_policy=api.AckPolicy.NONE, max_deliver=1,
            flow_control=True, idle_heartbeat=self.heartbeat, num_replicas=1, mem_storage=True,
            inactive_threshold=self.inactive,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT if from_seq is None else
            api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=from_seq,
        )
        self._active = True
        return await asyncio.wait_for(self.js.add_consumer(self.stream, config=config), self.timeout)

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await unsubscribe_raw(self.nc, sub)  # no more deliveries reach `_on_msg` from it

    def _on_msg(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        self._active = True
        if hdr is not None and status(hdr) is not None:
            self._on_control(reply, hdr)
            return
        tokens = ack_tokens(reply)
        delivered = int(tokens[ACK_CONSUMER_SEQ])
        if delivered != self._delivered + 1:
            self._restart()  # a delivery lost (or one from before a restart): start again after the last one
            return
        self._delivered = delivered
        seq = int(tokens[ACK_STREAM_SEQ])
        self.last_stream_seq = seq
        self.on_entry(subject, hdr, data, seq, int(tokens[ACK_PENDING]))

    def _on_control(self, reply: str, hdr: bytes) -> None:
        if reply:  # a flow control request: everything before it is handled already
            self._spawn(self._answer(reply))
            return
        headers = HeaderView(hdr)  # an idle heartbeat
        stalled = headers.get(api.Header.CONSUMER_STALLED.value)
        if stalled:
            self._spawn(self._answer(stalled))
        last = headers.get(api.Header.LAST_CONSUMER.value)
        if last and last.isdigit() and int(last) != self._delivered:
            self._restart()

    async def _answer(self, reply: str) -> None:
        with contextlib.suppress(*NATS_ERRORS):  # the server asks again, or the consumer is recreated
            await self.nc.publish(reply, b"")

    async def _watch_activity(self) -> None:
        """Neither a delivery nor a heartbeat for two intervals: the consumer is gone (a server
        restarted, a reconnect lost it), so it is created again."""
        while True:
            await asyncio.sleep(self.heartbeat * 2)
            if not self._active:
                self._restart()
            self._active = False

    def _restart(self) -> None:
        if self._restarting is None or self._restarting.done():
            self._restarting = self._spawn(self._recreate())

    async def _recreate(self) -> None:
        self.resets += 1
        try:
            await self._create(self.last_stream_seq + 1)
        except NATS_ERRORS as err:  # unreachable: the activity check tries again
            log.debug("recreating the ordered consumer on %s failed: %s", self.stream, err)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
