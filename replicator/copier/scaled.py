"""Scaled mode: many independent workers on one shared durable consumer.

Each message is acked on its own once the target acknowledged it, nak'ed with a delay on failure,
and deduplicated on the target by `Nats-Msg-Id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from replicator.copier.control import Backoff, Stopper, wait_wake
from replicator.copier.endpoints import (
    ACK_WAIT,
    POISON_ATTEMPTS,
    PUBLISH_TIMEOUT,
    Endpoints,
    flush_counts,
    settle,
    start_position,
    verdict,
)
from replicator.copier.failures import is_permanent, is_target_full
from replicator.copier.transform import MessageTransform
from replicator.sampling.limiter import Pending
from replicator.transport.jetstream import (
    ACK_DELIVERED,
    ACK_PENDING,
    ACK_STREAM_SEQ,
    ACK_TIMESTAMP,
    Publisher,
    PublishError,
    Puller,
    ack,
    ack_tokens,
    nak,
    term,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InFlight:
    msg: Msg
    future: asyncio.Future[None]
    started: float
    delivered: int


@dataclass
class ScaledWorker:
    """One of many workers sharing the group's durable: unordered, each message acked on its own."""

    ep: Endpoints
    stopper: Stopper = field(default_factory=Stopper)

    def __post_init__(self) -> None:
        self.wake = asyncio.Event()
        self.transform = MessageTransform(self.ep)
        self.publisher = Publisher(self.ep.target_nc, wake=self.wake)
        self.sent: deque[InFlight] = deque()  # send order, for timeouts
        self.finished: deque[InFlight] = deque()  # settled by the target, waiting to be acked or nak'ed
        self.in_flight = 0
        self.max_in_flight = self.ep.profile.settings.max_in_flight
        self.lag: str | None = None  # pending count of the latest delivery, set once per batch
        self.last_seq = 0

    async def run(self) -> None:
        ep = self.ep
        await self.publisher.start()
        backoff = Backoff()
        while not self.stopper.stopping:
            try:
                await ensure_group_consumer(ep, self.max_in_flight)
                break
            except Exception as err:
                log.warning("%s cannot bind consumer: %s", ep.worker, err)
                await self.stopper.sleep(backoff.next())
        puller = Puller(ep.source_nc, ep.source_stream, ep.profile.group_name, batch=ep.profile.settings.batch,
                        wake=self.wake, api_prefix=ep.api_prefix)
        await puller.start()
        ep.ready(True)
        last_check = time.monotonic()
        try:
            while not self.stopper.stopping:
                room = self.max_in_flight - self.in_flight
                if room > 0:
                    await puller.request(room)
                await wait_wake(self.wake, 1.0)
                if puller.last_status is not None:
                    status, text = puller.last_status
                    puller.last_status = None
                    log.warning("%s consumer status %d %s", ep.worker, status, text)
                    if "deleted" in text.lower():
                        with contextlib.suppress(Exception):
                            await ensure_group_consumer(ep, self.max_in_flight)
                        puller.reset()
                received = received_bytes = 0
                while puller.buffer and self.in_flight < self.max_in_flight:
                    msg = puller.buffer.popleft()
                    received += 1
                    received_bytes += len(msg.data)
                    await self._admit(msg)
                if received:
                    ep.metrics.received_msgs.inc(received)
                    ep.metrics.received_bytes.inc(received_bytes)
                    self._flush_counts()
                await self._settle()
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    await self._expire(now)
            # Stop: no new work; finish what is in flight.
            puller.buffer.clear()
            deadline = time.monotonic() + PUBLISH_TIMEOUT
            while self.in_flight and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 0.5)
                self.wake.clear()
                await self._settle()
            with contextlib.suppress(Exception):
                await ep.source_nc.flush(timeout=2)
        finally:
            ep.ready(False)
            await puller.stop()
            await self.publisher.stop()

    async def _admit(self, msg: Msg) -> None:
        ep = self.ep
        tokens = ack_tokens(msg.reply)
        seq = int(tokens[ACK_STREAM_SEQ])
        self.lag, self.last_seq = tokens[ACK_PENDING], seq
        copy = verdict(ep, msg, tokens)
        if isinstance(copy, Pending):
            copy = await settle(ep, copy)
        if not copy:
            await ack(ep.source_nc, msg.reply, ep.metrics.acks_failed.inc)
            return
        headers = self.transform.headers(msg, seq, int(tokens[ACK_TIMESTAMP]))
        fut = await self.publisher.publish(self.transform.rewrite(msg.subject), msg.data, headers)
        item = InFlight(msg, fut, time.monotonic(), int(tokens[ACK_DELIVERED]))
        self.sent.append(item)
        self.in_flight += 1
        fut.add_done_callback(functools.partial(self._finished, item))

    def _flush_counts(self) -> None:
        if self.lag is not None:
            self.ep.metrics.current_sequence.set(self.last_seq)
        flush_counts(self.ep, self.lag)
        self.lag = None

    def _finished(self, item: InFlight, _future: asyncio.Future[None]) -> None:
        self.finished.append(item)

    async def _settle(self) -> None:
        ep = self.ep
        m = ep.metrics
        now = time.monotonic()
        copied = copied_bytes = 0
        while self.finished:
            item = self.finished.popleft()
            self.in_flight -= 1
            fut = item.future
            err = fut.exception() if not fut.cancelled() else PublishError("publish timed out")
            if err is None:
                copied += 1
                copied_bytes += len(item.msg.data)
                m.processing_time.observe(now - item.started)
                await ack(ep.source_nc, item.msg.reply, m.acks_failed.inc)
                continue
            m.failed_msgs.inc()
            perr = err if isinstance(err, PublishError) else PublishError(str(err))
            if is_permanent(perr) and item.delivered >= POISON_ATTEMPTS:
                log.error("%s gave up on a message after %d deliveries: %s (terminated, counted in failed_msgs)",
                          ep.worker, item.delivered, perr.description)
                await term(ep.source_nc, item.msg.reply, m.acks_failed.inc)
                continue
            delay = min(0.25 * 2 ** min(item.delivered, 5), 10.0)
            if is_target_full(perr):
                m.target_blocked.set(1)
            log.warning("%s publish failed (%s): redelivery in %.1fs", ep.worker, perr.description, delay)
            await nak(ep.source_nc, item.msg.reply, delay, m.acks_failed.inc)
        if copied:
            m.copied_msgs.inc(copied)
            m.copied_bytes.inc(copied_bytes)
            m.target_blocked.set(0)

    async def _expire(self, now: float) -> None:
        """Publishes whose ack never came (lost in a disconnect) fail, and the message is redelivered."""
        while self.sent and (self.sent[0].future.done() or now - self.sent[0].started > PUBLISH_TIMEOUT):
            item = self.sent.popleft()
            if not item.future.done():
                item.future.cancel()
        await self._settle()


async def ensure_group_consumer(ep: Endpoints, max_in_flight: int) -> None:
    """The shared durable: created once (first-start position), then just bound by every worker."""
    name = ep.profile.group_name
    try:
        await ep.source_js.consumer_info(ep.source_stream, name)
        return
    except NotFoundError:
        pass
    config = ConsumerConfig(
        durable_name=name,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT,
        max_ack_pending=max(20_000, max_in_flight * 8),
        filter_subject=ep.profile.settings.topic,
        max_waiting=2048,
        **start_position(ep.profile),  # type: ignore[arg-type]
    )
    try:
        await ep.source_js.add_consumer(ep.source_stream, config)
    except Exception:
        # Another worker or pod created it first with the same settings: bind to that one.
        await ep.source_js.consumer_info(ep.source_stream, name)
