"""Copy loops: consume -> (max_age, limiter) -> publish -> ack.

Ordered mode keeps up to `max_in_flight` publishes in flight yet never lets a later message land
before an earlier one: every publish carries `Nats-Expected-Last-Msg-Id` naming its predecessor, so
if any message fails, every later one in the window fails too. Recovery then reads the target's
last provenance header, drops what landed, and republishes the rest, the first one synchronously
(no predecessor check, so a server that lost its last-id after a restart cannot wedge the chain).
The source is acked cumulatively (AckAll) only after the target acknowledged.

Scaled mode is many independent workers on one shared durable: each message is acked on its own
once the target acknowledged it, nak'ed with a delay on failure, and deduplicated on the target by
`Nats-Msg-Id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from replicator.config import Profile
from replicator.jetstream_raw import (
    ACK_CONSUMER_SEQ,
    ACK_DELIVERED,
    ACK_PENDING,
    ACK_STREAM_SEQ,
    ACK_TIMESTAMP,
    PERMANENT_CODES,
    STREAM_FULL_HINTS,
    Publisher,
    PublishError,
    Puller,
    ack,
    ack_tokens,
    nak,
    term,
)
from replicator.metrics import WorkerMetrics
from replicator.sampling import Pending
from replicator.streams import (
    EXPECTED_LAST_MSG_ID,
    MSG_ID,
    PROVENANCE,
    SubjectRewriter,
    last_copied,
    provenance,
)

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 5.0
ACK_WAIT = 30.0
POISON_ATTEMPTS = 5
MAX_BYTES_IN_FLIGHT = 8 * 1024 * 1024
EXPECTED_PREFIX = "Nats-Expected-"


class Decider(Protocol):
    """The limiter as the copy loops see it: `check` decides at once when it can (a skip, at fleet
    rates, costs no await), else returns what `settle` needs to decide with the shared store;
    `flush` publishes its counts, once per batch."""

    def check(self, subject: str, headers: dict[str, str] | None, payload: bytes) -> bool | Pending: ...
    async def settle(self, pending: Pending) -> bool: ...
    def flush(self) -> None: ...


def verdict(ep: Endpoints, msg: Msg, tokens: list[str]) -> bool | Pending:
    """Copy this delivery? Not when older than `max_age` (counted) or sampled out; `Pending` when
    only `settle` can tell. Synchronous, because at fleet rates most answers need no waiting."""
    max_age = ep.profile.settings.max_age
    if max_age and time.time() - int(tokens[ACK_TIMESTAMP]) / 1e9 > max_age:
        ep.metrics.too_old_msgs.inc()
        return False
    limiter = ep.limiter
    return True if limiter is None else limiter.check(msg.subject, msg.headers, msg.data)


async def settle(ep: Endpoints, pending: Pending) -> bool:
    assert ep.limiter is not None
    return await ep.limiter.settle(pending)


@dataclass
class Endpoints:
    """What a copy loop needs, prepared by the runner: connections, streams, names."""

    profile: Profile
    source_nc: Client
    target_nc: Client
    source_stream: str
    target_stream: str
    worker: str
    metrics: WorkerMetrics
    limiter: Decider | None = None
    api_prefix: str = "$JS.API"
    ready: Callable[[bool], None] = lambda _ready: None

    @property
    def source_js(self) -> JetStreamContext:
        return self.source_nc.jetstream()

    @property
    def target_js(self) -> JetStreamContext:
        return self.target_nc.jetstream()


def start_position(profile: Profile) -> dict[str, object]:
    """Consumer settings for the very first start (never applied when resuming)."""
    s = profile.settings
    if s.start_sequence:
        return {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": s.start_sequence}
    if s.start_time:
        return {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": s.start_time.isoformat()}
    if s.start_delta:
        start = time.time() - s.start_delta
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        return {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": stamp}
    if s.start_at_end:
        return {"deliver_policy": DeliverPolicy.NEW}
    return {"deliver_policy": DeliverPolicy.ALL}


class Stopper:
    """A stop request that loops can both poll and await."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    def stop(self) -> None:
        self.event.set()

    async def sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), seconds)


async def wait_wake(wake: asyncio.Event, timeout: float) -> None:
    """Wait for new messages or acks, at most `timeout`; cheaper than wait_for (no task per wait)."""
    if not wake.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await wake.wait()
    wake.clear()


class Backoff:
    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, self.cap)
        return delay * (0.8 + random.random() * 0.4)

    def reset(self) -> None:
        self.delay = self.first


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


def flush_counts(ep: Endpoints, lag: str | None) -> None:
    """Per-batch metrics (a locked update per message would cost more than a skipped message)."""
    if lag is not None:
        ep.metrics.lag_msgs.set(int(lag))
    if ep.limiter is not None:
        ep.limiter.flush()


def is_permanent(err: PublishError) -> bool:
    return err.code in PERMANENT_CODES or "maximum payload" in err.description.lower()


def is_target_full(err: PublishError) -> bool:
    return any(hint in err.description.lower() for hint in STREAM_FULL_HINTS)


@dataclass(slots=True)
class Entry:
    """One message in the ordered window, on its way to the target, and the skipped (sampled out,
    too old) deliveries behind it: they are done when it is, and need no entry of their own."""

    msg: Msg
    seq: int
    received: float
    subject: str
    headers: dict[str, str]
    future: asyncio.Future[None] | None = None
    sent_at: float = 0.0
    attempts: int = 0
    skipped_seq: int = 0
    skipped_reply: str = ""

    @property
    def last_seq(self) -> int:
        return self.skipped_seq or self.seq

    @property
    def last_reply(self) -> str:
        return self.skipped_reply or self.msg.reply


@dataclass
class OrderedCopier:
    """The single active worker of a topic: pipelined, in order, exactly once on the target."""

    ep: Endpoints
    stopper: Stopper = field(default_factory=Stopper)

    def __post_init__(self) -> None:
        s = self.ep.profile.settings
        self.window: deque[Entry] = deque()
        self.max_in_flight = s.max_in_flight
        self.wake = asyncio.Event()
        self.transform = MessageTransform(self.ep)
        self.publisher = Publisher(self.ep.target_nc, wake=self.wake)
        self.puller: Puller | None = None
        self.committed = 0  # highest source sequence copied or skipped, in order
        self.ack_due: str | None = None  # reply subject of `committed` while not yet acked (AckAll)
        self.lag: str | None = None  # pending count of the latest delivery, set once per batch
        self.last_id: str | None = None  # Nats-Msg-Id of the last message published in the chain
        self.chain_open = False  # False: the next publish goes alone, without predecessor check
        self.backoff = Backoff()
        self.blocked_since: float | None = None
        self.avg_size = 1024.0  # payload bytes per message, learned as messages arrive
        # Consumer (delivery) sequence of the last message delivered: deliveries count up by one, so
        # a jump means messages were lost in transit (a cut link) and must be fetched again.
        self.last_cseq = 0
        self.gap: tuple[int, int] | None = None

    # ---- setup ----
    async def resume_point(self) -> tuple[int, bool]:
        """(next source sequence, resuming?) from the target's provenance and the consumer's ack floor."""
        ep = self.ep
        landed = await last_copied(
            ep.target_js, ep.target_stream, self.transform.rewrite(ep.profile.settings.topic),
            ep.source_stream, ep.profile.base_name,
        )
        floor = 0
        existed = False
        try:
            info = await ep.source_js.consumer_info(ep.source_stream, ep.profile.durable_name)
            existed = True
            floor = info.ack_floor.stream_seq if info.ack_floor and info.ack_floor.stream_seq else 0
        except NotFoundError:
            pass
        resume = max(landed, floor)
        return resume + 1, existed or landed > 0

    async def bind(self) -> None:
        """(Re)create the durable at the resume point: the server's redelivery order cannot be trusted
        for messages that were in flight when the previous worker died."""
        ep = self.ep
        next_seq, resuming = await self.resume_point()
        name = ep.profile.durable_name
        with contextlib.suppress(NotFoundError):
            await ep.source_js.delete_consumer(ep.source_stream, name)
        position: dict[str, object]
        if resuming:
            position = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": next_seq}
        else:
            position = start_position(ep.profile)
        await ep.source_js.add_consumer(ep.source_stream, self._consumer_config(position))
        self.committed = next_seq - 1 if resuming else 0
        self.chain_open = False
        self.last_cseq = 0
        self.gap = None
        log.info("%s bound to %s/%s at %s", ep.worker, ep.source_stream, name,
                 f"sequence {next_seq}" if resuming else position["deliver_policy"])

    def _consumer_config(self, position: dict[str, object]) -> ConsumerConfig:
        ep = self.ep
        return ConsumerConfig(
            durable_name=ep.profile.durable_name,
            ack_policy=AckPolicy.ALL,
            ack_wait=ACK_WAIT,
            max_ack_pending=self.max_in_flight * 2,
            filter_subject=ep.profile.settings.topic,
            max_waiting=512,
            **position,  # type: ignore[arg-type]
        )

    # ---- main loop ----
    async def run(self) -> None:
        ep = self.ep
        await self.publisher.start()
        try:
            while not self.stopper.stopping:
                try:
                    await self.bind()
                    break
                except Exception as err:
                    log.warning("%s cannot bind consumer: %s", ep.worker, err)
                    await self.stopper.sleep(self.backoff.next())
            self.backoff.reset()
            self.puller = Puller(ep.source_nc, ep.source_stream, ep.profile.durable_name,
                                 batch=ep.profile.settings.batch, wake=self.wake, api_prefix=ep.api_prefix)
            await self.puller.start()
            ep.ready(True)
            await self._loop()
            await self._finish()
        finally:
            ep.ready(False)
            if self.puller:
                await self.puller.stop()
            await self.publisher.stop()

    async def _loop(self) -> None:
        assert self.puller is not None
        puller = self.puller
        idle_checks = 0.0
        while not self.stopper.stopping:
            # Ask for up to a whole window beyond the window (the consumer's max_ack_pending), so
            # the fetch round trip to the source overlaps the publish round trip to the target even
            # on long links; but keep the bytes in flight well inside the client's outbound buffer,
            # or large messages stall on forced flushes.
            room = 2 * self.max_in_flight - len(self.window)
            held = (len(self.window) + len(puller.buffer) + puller.requested) * self.avg_size
            if room > 0 and held < MAX_BYTES_IN_FLIGHT:
                await puller.request(min(room, max(puller.batch, int(MAX_BYTES_IN_FLIGHT / self.avg_size))))
            await wait_wake(self.wake, 1.0)
            if puller.last_status is not None:
                status, text = puller.last_status
                puller.last_status = None
                await self._consumer_trouble(status, text)
                continue
            admitted = received_bytes = 0
            while puller.buffer and len(self.window) < self.max_in_flight and self.gap is None:
                msg = puller.buffer.popleft()
                if await self._admit(msg):
                    admitted += 1
                    received_bytes += len(msg.data)
            if admitted:
                self.avg_size = 0.8 * self.avg_size + 0.2 * (received_bytes / admitted)
                self.ep.metrics.received_msgs.inc(admitted)
                self.ep.metrics.received_bytes.inc(received_bytes)
                self._flush_counts()
            await self._drain()
            if self.gap is not None:
                first, last = self.gap
                log.warning("%s deliveries %d..%d of consumer %s were lost in transit: fetching them again",
                            self.ep.worker, first, last, self.ep.profile.durable_name)
                await self._rebind(delete=True)
                continue
            now = time.monotonic()
            if now - idle_checks > 1.0:
                idle_checks = now
                await self._check_stalled(now)

    async def _admit(self, msg: Msg) -> bool:
        """Put a delivered message in the window (and on its way to the target); False if a redelivery."""
        ep = self.ep
        tokens = ack_tokens(msg.reply)
        cseq = int(tokens[ACK_CONSUMER_SEQ])
        if cseq <= self.last_cseq:
            return False  # delivered before, or by a consumer we have since replaced
        if cseq != self.last_cseq + 1:
            # A delivery never arrived; admitting this one would let AckAll acknowledge the lost one.
            self.gap = (self.last_cseq + 1, cseq - 1)
            return False
        self.last_cseq = cseq
        seq = int(tokens[ACK_STREAM_SEQ])
        window = self.window
        if seq <= self.committed or (window and seq <= window[-1].last_seq):
            if seq <= self.committed and tokens[ACK_DELIVERED] != "1":
                await ack(ep.source_nc, msg.reply, ep.metrics.acks_failed.inc)
            return False  # a redelivery of something done or already in the window
        self.lag = tokens[ACK_PENDING]
        copy = verdict(ep, msg, tokens)
        if isinstance(copy, Pending):
            copy = await settle(ep, copy)
        if not copy:
            if window:  # done when the copy ahead of it is
                tail = window[-1]
                tail.skipped_seq, tail.skipped_reply = seq, msg.reply
            else:
                self.committed, self.ack_due = seq, msg.reply
            return True
        entry = Entry(msg, seq, time.monotonic(), self.transform.rewrite(msg.subject),
                      self.transform.headers(msg, seq, int(tokens[ACK_TIMESTAMP])))
        window.append(entry)
        if self.chain_open:
            await self._send(entry)
        elif window[0] is entry:
            await self._send_alone(entry)
        return True

    def _flush_counts(self) -> None:
        flush_counts(self.ep, self.lag)
        self.lag = None

    def _first_copy(self) -> Entry | None:
        return self.window[0] if self.window else None

    async def _send(self, entry: Entry) -> None:
        assert entry.headers is not None
        if self.last_id is not None:
            entry.headers[EXPECTED_LAST_MSG_ID] = self.last_id
        else:
            entry.headers.pop(EXPECTED_LAST_MSG_ID, None)
        entry.sent_at = time.monotonic()
        entry.attempts += 1
        entry.future = await self.publisher.publish(entry.subject, entry.msg.data, entry.headers)
        self.last_id = entry.headers[MSG_ID]

    async def _send_alone(self, entry: Entry) -> None:
        """Publish without a predecessor check and wait: the safe way to (re)start the chain."""
        assert entry.headers is not None
        entry.headers.pop(EXPECTED_LAST_MSG_ID, None)
        entry.sent_at = time.monotonic()
        entry.attempts += 1
        fut = await self.publisher.publish(entry.subject, entry.msg.data, entry.headers)
        try:
            await asyncio.wait_for(asyncio.shield(fut), PUBLISH_TIMEOUT)
        except TimeoutError:
            fut.cancel()
            entry.future = fut
            return
        except PublishError:
            entry.future = fut
            return
        entry.future = fut
        self.last_id = entry.headers[MSG_ID]
        self.chain_open = True
        # Anything admitted behind it while we waited can now go, chained.
        for later in self.window:
            if later.future is None and later is not entry:
                await self._send(later)

    async def _drain(self) -> None:
        """Retire the completed prefix of the window in order, then ack the source once (AckAll)."""
        ep = self.ep
        m = ep.metrics
        now = time.monotonic()
        copied = copied_bytes = 0
        observe = m.processing_time.observe
        failed: tuple[Entry, PublishError] | None = None
        window = self.window
        while window:
            head = window[0]
            fut = head.future
            if fut is None or not fut.done():
                break
            err = fut.exception() if not fut.cancelled() else PublishError("publish timed out")
            if err is not None:
                failed = head, err if isinstance(err, PublishError) else PublishError(str(err))
                break
            copied += 1
            copied_bytes += len(head.msg.data)
            observe(now - head.received)
            window.popleft()
            self.committed, self.ack_due = head.last_seq, head.last_reply
        if copied:
            self._count_copied(copied, copied_bytes)
            if self.blocked_since is not None:
                log.info("%s target accepts messages again", ep.worker)
                self.blocked_since = None
                m.target_blocked.set(0)
        if self.ack_due is not None:
            reply, self.ack_due = self.ack_due, None
            m.current_sequence.set(self.committed)
            self.backoff.reset()
            await ack(ep.source_nc, reply, m.acks_failed.inc)
        if failed is not None:
            await self._recover(*failed)

    def _count_copied(self, n: int, size: int) -> None:
        if n:
            self.ep.metrics.copied_msgs.inc(n)
            self.ep.metrics.copied_bytes.inc(size)

    async def _check_stalled(self, now: float) -> None:
        """A publish whose ack never came (lost in a disconnect) counts as failed."""
        if not self.window:
            return
        head = self.window[0]
        if head.future is not None and not head.future.done() and now - head.sent_at > PUBLISH_TIMEOUT:
            await self._recover(head, PublishError("publish timed out"))
        elif not self.chain_open:
            first = self._first_copy()
            if first is not None and first.future is None:
                await self._send_alone(first)

    async def _recover(self, head: Entry, err: PublishError) -> None:
        """The head failed: settle the window, learn what landed, and republish the rest in order."""
        ep = self.ep
        m = ep.metrics
        m.failed_msgs.inc()
        full = is_target_full(err)
        if full and self.blocked_since is None:
            self.blocked_since = time.monotonic()
            m.target_blocked.set(1)
            log.warning("%s target stream %s refuses messages (%s): backing off until there is room",
                        ep.worker, ep.target_stream, err.description)
        elif not full:
            log.warning("%s publish of source sequence %d failed: %s", ep.worker, head.seq, err.description)
        # Let whatever is still in flight settle, so the target's state stops moving.
        pending = [e.future for e in self.window if e.future is not None and not e.future.done()]
        if pending:
            await asyncio.wait(pending, timeout=PUBLISH_TIMEOUT)
        self.publisher.forget_all()
        landed = await self._landed_up_to()
        if landed is None:
            await self.stopper.sleep(self.backoff.next())
            for e in self.window:
                _settled(e.future)
                e.future = None
            self.chain_open = False
            return
        # Messages acknowledged before the failure stay done; the landed prefix is done too.
        while self.window and (self.window[0].seq <= landed or self._acked_ok(self.window[0])):
            done = self.window.popleft()
            _settled(done.future)
            self._count_copied(1, len(done.msg.data))
            self.committed, self.ack_due = done.last_seq, done.last_reply
        if self.window and self.window[0] is head and is_permanent(err) and head.attempts >= POISON_ATTEMPTS:
            self.window.popleft()
            self.committed, self.ack_due = head.last_seq, head.last_reply
            log.error("%s gave up on source sequence %d after %d attempts: %s (skipped, counted in failed_msgs)",
                      ep.worker, head.seq, head.attempts, err.description)
        for e in self.window:
            _settled(e.future)
            e.future = None
        self.chain_open = False
        if self.committed:
            m.current_sequence.set(self.committed)
        await self.stopper.sleep(self.backoff.next())
        first = self._first_copy()
        if first is not None and not self.stopper.stopping:
            await self._send_alone(first)
        await self._drain()

    @staticmethod
    def _acked_ok(entry: Entry) -> bool:
        fut = entry.future
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    async def _landed_up_to(self) -> int | None:
        ep = self.ep
        try:
            return await last_copied(
                ep.target_js, ep.target_stream, self.transform.rewrite(ep.profile.settings.topic),
                ep.source_stream, ep.profile.base_name,
            )
        except Exception as err:
            log.warning("%s cannot read the target's last message yet: %s", ep.worker, err)
            return None

    async def _consumer_trouble(self, status: int, text: str) -> None:
        """409s: the consumer was deleted or lost leadership; rebind where we are."""
        ep = self.ep
        log.warning("%s consumer status %d %s", ep.worker, status, text)
        if "deleted" in text.lower() or (status == 409 and "leadership" in text.lower()):
            await self._rebind(delete=False)

    async def _rebind(self, *, delete: bool) -> None:
        """Point the durable right after what we hold (window or committed) and pull afresh.

        `delete`: the consumer still exists but lost deliveries in transit; it is replaced, and the
        puller takes a new inbox so deliveries still on their way from the old one are dropped
        rather than mistaken for new ones.
        """
        assert self.puller is not None
        ep = self.ep
        resume = max(self.committed, self.window[-1].last_seq if self.window else 0) + 1
        position = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": resume}
        try:
            if delete:
                with contextlib.suppress(NotFoundError):
                    await ep.source_js.delete_consumer(ep.source_stream, ep.profile.durable_name)
            await ep.source_js.add_consumer(ep.source_stream, self._consumer_config(position))
            await self.puller.restart()
            self.last_cseq = 0
            self.gap = None
            log.info("%s recreated consumer %s at sequence %d", ep.worker, ep.profile.durable_name, resume)
        except Exception as err:
            log.warning("%s cannot recreate consumer: %s", ep.worker, err)
            await self.stopper.sleep(self.backoff.next())

    async def _finish(self) -> None:
        """On stop: finish and ack what is in flight (bounded), then stop."""
        deadline = time.monotonic() + PUBLISH_TIMEOUT * 2
        if self.puller is not None:
            self.puller.buffer.clear()
        await self._drain()  # skips admitted last are acked here even with an empty window
        while self.window and time.monotonic() < deadline:
            if not self.chain_open:
                first = self._first_copy()
                if first is not None and first.future is None:
                    await self._send_alone(first)
            pending = [e.future for e in self.window if e.future is not None and not e.future.done()]
            if pending:
                await asyncio.wait(pending, timeout=1.0)
            before = len(self.window)
            await self._drain()
            if len(self.window) == before and not pending:
                break
        with contextlib.suppress(Exception):
            await self.ep.source_nc.flush(timeout=2)


def _settled(fut: asyncio.Future[None] | None) -> None:
    """Drop a publish future we no longer wait for, reading its error first: an unread one makes
    asyncio log "Future exception was never retrieved" with a traceback, once per message."""
    if fut is not None and fut.done() and not fut.cancelled():
        fut.exception()


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

