"""Scaled mode: many independent workers on one shared durable consumer.

Each message is acked on its own once the target acknowledged it, nak'ed with a delay on failure
(terminated once given up as poison), and deduplicated on the target by its writer's
`Nats-Msg-Id` (`provenance.py`), the same in every worker and pod of the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from replicator.copier.control import Backoff, Stopper, wait_wake
from replicator.copier.durable import FRESH_ATTEMPTS, OWNER_NOTE
from replicator.copier.endpoints import (
    ACK_WAIT,
    POISON_ATTEMPTS,
    PUBLISH_TIMEOUT,
    Endpoints,
    settle,
    source_identity,
    start_position,
    verdict_for,
)
from replicator.copier.failures import Failure, classify
from replicator.copier.headers import TargetFeatures
from replicator.copier.lag import LagWatch
from replicator.copier.loops import LoopGuard
from replicator.copier.loss import LossLedger
from replicator.copier.poison import StuckWatch, describe, give_up
from replicator.copier.scaled_loss import GroupLoss
from replicator.copier.transform import MessageTransform
from replicator.observe.metrics import observe_many
from replicator.sampling.limiter import Pending
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.jetstream import (
    Publisher,
    PublishError,
    Puller,
    ack,
    ack_many,
    nak,
    term,
)
from replicator.transport.streams import StreamSetupError, ack_floor
from replicator.transport.wire import (
    ACK_CONSUMER_SEQ,
    ACK_DELIVERED,
    ACK_PENDING,
    ACK_STREAM_SEQ,
    ACK_TIMESTAMP,
    RawMsg,
    ack_tokens,
)

log = logging.getLogger(__name__)

GROUP_READ_EVERY = 10.0  # seconds between a process's reads of the group durable's ack floor


class BindError(Exception):
    """The group's durable cannot be bound yet: the stream was created again while binding, or a
    durable created afresh stays behind the handover. The worker backs off and binds again."""


# What binding, and reading the source stream, fail with when the servers or the stream are not (yet) as
# they should be: the worker backs off and tries again. Anything else is a bug and stops it.
READ_FAILURES: tuple[type[BaseException], ...] = (*NATS_ERRORS, StreamSetupError)
BIND_FAILURES: tuple[type[BaseException], ...] = (*READ_FAILURES, BindError)


class GroupState:
    """What the workers of one process share about the group's durable: one of them creates it
    at a time (`creating`), and its ack floor as last read, with the source stream instance it
    belongs to (a durable deleted under running workers is created again after it)."""

    def __init__(self) -> None:
        self.creating = asyncio.Lock()
        self.floor = 0
        self.floor_of: str | None = None
        self.read_at = 0.0
        self.loss: GroupLoss | None = None  # source-side loss, seen by all of the process's workers

    def note(self, info: ConsumerInfo, identity: str) -> int:
        """Keep the durable's ack floor, and return it."""
        floor = ack_floor(info)
        if identity != self.floor_of or floor > self.floor:
            self.floor, self.floor_of = floor, identity
        return floor


@dataclass(slots=True)
class InFlight:
    msg: RawMsg
    started: float
    delivered: int
    seq: int
    ts: int
    subject: str
    token: str = ""  # the publisher's, while its answer is awaited
    error: PublishError | None = None
    done: bool = False


@dataclass
class ScaledWorker:
    """One of many workers sharing the group's durable: unordered, each message acked on its own."""

    ep: Endpoints
    stopper: Stopper = field(default_factory=Stopper)
    group: GroupState = field(default_factory=GroupState)  # shared by the process's workers

    def __post_init__(self) -> None:
        self.wake = asyncio.Event()
        self.transform = MessageTransform(self.ep)
        self.guard = LoopGuard(self.ep, self.transform, self.ep.profile.group_name)
        self.verdict = verdict_for(self.ep, self.guard.looped)
        self.publisher = Publisher(self.ep.target_nc, wake=self.wake, on_result=self._finished)
        self.sent: deque[InFlight] = deque()  # send order, for timeouts
        self.finished: deque[InFlight] = deque()  # settled by the target, waiting to be acked or nak'ed
        self.in_flight = 0
        self.max_in_flight = self.ep.profile.settings.max_in_flight
        self.lag: str | None = None  # pending count of the latest delivery, set once per batch
        self.last_seq = 0
        # The durable's delivery counter, as of the bind or the last delivery: it only grows while
        # the durable lives, so a delivery's not above it means the durable was created again
        # (and the stream too, maybe).
        self.last_cseq = 0
        self.bound = False  # pull nothing until bound (again: the stream's identity is in doubt)
        self.stuck = StuckWatch(self.ep, self.ep.profile.group_name)
        self.lag_watch = LagWatch(self.ep, self.ep.profile.group_name)  # the lag while copies cannot land
        self.landed = 0  # copies acked so far: `lag_watch`'s progress marker
        self.behind = False  # the latest delivery had messages pending behind it
        self.features_read = 0.0

    async def _bind(self) -> None:
        """The group's durable, this source stream instance's writer id, the target's features.
        The durable's delivery counter is taken before the stream's identity is read: a first
        delivery with a counter not above it comes from a durable created since, maybe on a new
        stream."""
        ep = self.ep
        resume = await self._floor_to_resume()
        group = self.group
        durable = await ensure_group_consumer(ep, self.max_in_flight, group.creating, resume)
        self.last_cseq = durable.delivered.consumer_seq or 0 if durable.delivered else 0
        identity = await source_identity(ep)
        if resume and identity != group.floor_of:
            # Created again between the two reads: the floor is the old stream's, and a durable
            # made after it would skip the new stream's first messages.
            group.floor, group.floor_of = 0, None
            with contextlib.suppress(NotFoundError):
                await ep.source_js.delete_consumer(ep.source_stream, ep.profile.group_name)
            raise BindError(f"source stream {ep.source_stream} was created again while binding")
        self.transform.set_writer(identity)
        await self.guard.bind()
        group.note(durable, identity)
        if group.loss is None:
            group.loss = GroupLoss(LossLedger(ep, consumer=ep.profile.group_name))
            try:
                await group.loss.start()
            except BaseException:  # not started: the next bind starts it again; the error is the bind's
                group.loss = None
                raise
        group.loss.bound(durable, identity)
        await self._read_features()

    async def _floor_to_resume(self) -> int:
        """The ack floor a missing durable is created after: the last this process read, if the
        source stream is still the instance it was read from (else 0: the start position)."""
        group = self.group
        if not group.floor:
            return 0
        return group.floor if await source_identity(self.ep) == group.floor_of else 0

    async def _rebind(self, puller: Puller, backoff: Backoff) -> None:
        """Bind again before pulling more: a worker that pulled on with the old stream's writer id
        would copy the new stream's messages under it, and the target would drop them as
        duplicates of the old stream's copies with the same sequences."""
        try:
            await self._bind()
        except BIND_FAILURES as err:
            log.warning("%s cannot bind consumer: %s", self.ep.worker, err)
            await self.stopper.sleep(backoff.next())
            return
        backoff.reset()
        puller.reset()
        self.bound = True

    async def _check_writer(self) -> None:
        """The durable was created again without a status reaching this worker (it had no request
        waiting, or the reply was lost): was the stream created again too? Unknown: unbound."""
        ep = self.ep
        try:
            identity = await source_identity(ep)
        except READ_FAILURES as err:
            log.warning("%s cannot read source stream %s: %s", ep.worker, ep.source_stream, err)
            self.bound = False
            return
        if identity != self.transform.writer.identity:
            log.warning("%s source stream %s was deleted and created again: copying it as a new writer",
                        ep.worker, ep.source_stream)
            self.transform.set_writer(identity)

    async def _read_features(self) -> None:
        self.features_read = time.monotonic()
        info = await self.ep.target_js.stream_info(self.ep.target_stream)
        self.transform.set_features(TargetFeatures.of(info.config))

    async def run(self) -> None:
        ep = self.ep
        await self.publisher.start()
        backoff = Backoff()
        puller = Puller(ep.source_nc, ep.source_stream, ep.profile.group_name, batch=ep.profile.settings.batch,
                        wake=self.wake, api_prefix=ep.api_prefix)
        await puller.start()
        try:
            while not self.stopper.stopping and not self.bound:
                await self._rebind(puller, backoff)
            ep.ready(True)
            last_check = time.monotonic()
            while not self.stopper.stopping:
                if not self.bound:
                    await self._rebind(puller, backoff)
                room = self.max_in_flight - self.in_flight
                if room > 0 and self.bound:
                    await puller.request(room)
                await wait_wake(self.wake, 1.0)
                if puller.last_status is not None:
                    status, text = puller.last_status
                    puller.last_status = None
                    if status == 503 or "deleted" in text.lower():  # gone (a re-created stream?): bind again
                        self.bound = False
                    else:
                        log.warning("%s consumer status %d %s", ep.worker, status, text)
                received = received_bytes = 0
                out: list[tuple[str, bytes | None, bytes]] = []
                items: list[InFlight] = []
                while puller.buffer and self.bound and self.in_flight + len(items) < self.max_in_flight:
                    msg = puller.buffer.popleft()
                    received += 1
                    received_bytes += len(msg.data)
                    await self._admit(msg, out, items, puller.buffer)
                if not self.bound:  # the source stream's identity is unknown: what came is dropped
                    puller.reset()
                if items:
                    self.in_flight += len(items)
                    self.sent.extend(items)
                    for item, token in zip(items, await self.publisher.publish_many(out, items), strict=True):
                        item.token = token
                if received:
                    puller.size_for(received_bytes / received)
                    ep.metrics.received_msgs.inc(received)
                    ep.metrics.received_bytes.inc(received_bytes)
                    self._flush_counts()
                await self._settle()
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    await self._expire(now)
                    await self.lag_watch.check(now, self.landed, bool(self.in_flight or puller.buffer), self.behind)
                    if self.group.loss is not None and now - self.group.loss.checked >= 1.0:
                        await self.group.loss.check()
                    if self.bound and (self.stuck.since or now - self.group.read_at > GROUP_READ_EVERY):
                        self.group.read_at = now  # the process's other workers need not read it too
                        await self._read_group()
            # Stop: no new work; finish what is in flight.
            puller.buffer.clear()
            deadline = time.monotonic() + PUBLISH_TIMEOUT
            while self.in_flight and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 0.5)
                self.wake.clear()
                await self._settle()
            await self.stuck.stopped()
            with contextlib.suppress(Exception):
                await ep.source_nc.flush(timeout=2)
        finally:
            ep.ready(False)
            await self.guard.settle()
            await puller.stop()
            await self.publisher.stop()

    async def _read_group(self) -> None:
        """The group durable's ack floor, every second while a message this worker saw fail is
        unsettled: it may be redelivered to another worker or pod and land there, and only the
        floor tells this worker, which would report itself stuck for ever. Otherwise every
        `GROUP_READ_EVERY` seconds, by one worker of the process, for `_floor_to_resume`."""
        ep = self.ep
        try:
            info = await ep.source_js.consumer_info(ep.source_stream, ep.profile.group_name)
        except NATS_ERRORS as err:  # deleted (the next pull says so), or the source unreachable
            log.debug("%s cannot read consumer %s: %s", ep.worker, ep.profile.group_name, err)
            return
        floor = self.group.note(info, self.transform.writer.identity)
        if self.stuck.since:
            await self.stuck.settled_upto(floor)

    async def _admit(self, msg: RawMsg, out: list[tuple[str, bytes | None, bytes]], items: list[InFlight],
                     behind: deque[RawMsg]) -> None:
        """Decide on one delivery: skipped ones are acked at once, copies join `out` (and `items`)
        to be published together. `behind`: the deliveries after it, whose sampling claims may
        start while this one waits for its own."""
        ep = self.ep
        tokens = ack_tokens(msg.reply)
        cseq = int(tokens[ACK_CONSUMER_SEQ])
        if cseq <= self.last_cseq:
            await self._check_writer()
            if not self.bound:
                return  # not acked: redelivered once bound again
        self.last_cseq = cseq
        seq = int(tokens[ACK_STREAM_SEQ])
        self.lag, self.last_seq = tokens[ACK_PENDING], seq
        ts = int(tokens[ACK_TIMESTAMP])
        if self.group.loss is not None:
            self.group.loss.saw(cseq, seq, int(tokens[ACK_DELIVERED]), ts)
        if ep.clock is not None:
            ep.clock.observe_ns(ts)
        copy = self.verdict(msg, tokens, seq)
        if isinstance(copy, Pending):
            copy = await settle(ep, copy, behind)
        if not copy:
            await ack(ep.source_nc, msg.reply, ep.metrics.acks_failed.inc)
            return
        built = self.transform.build(msg, seq, ts)
        out.append((built.subject, built.block(), built.payload))
        items.append(InFlight(msg, time.monotonic(), int(tokens[ACK_DELIVERED]), seq, ts, built.subject))

    def _flush_counts(self) -> None:
        if self.lag is not None:
            self.ep.metrics.current_sequence.set(self.last_seq)
            self.behind = self.lag != "0"
        self.lag_watch.flush(self.lag)
        self.lag = None

    def _finished(self, key: object, _pub_ack: bytes, error: PublishError | None) -> None:
        item = key
        assert isinstance(item, InFlight)
        item.error, item.done = error, True
        self.finished.append(item)

    async def _settle(self) -> None:
        ep = self.ep
        m = ep.metrics
        now = time.monotonic()
        copied_bytes = 0
        started: list[float] = []
        acks: list[str] = []
        loss = self.group.loss
        while self.finished:
            item = self.finished.popleft()
            self.in_flight -= 1
            perr = item.error
            if loss is not None:  # a failed one is nak'ed below, or given up (then not lost: counted as poison)
                loss.nakd(item.seq, item.ts) if perr is not None else loss.copied(item.seq)
            if perr is None:
                copied_bytes += len(item.msg.data)
                started.append(item.started)
                acks.append(item.msg.reply)
                if self.stuck.since:
                    await self.stuck.done(item.seq)
                continue
            m.failed_msgs.inc()
            kind = classify(perr)
            if kind is Failure.PERMANENT and item.delivered >= POISON_ATTEMPTS:
                await give_up(ep, self.publisher, self.transform.writer, item.msg, item.seq, item.ts, item.subject,
                              perr, item.delivered)
                await term(ep.source_nc, item.msg.reply, m.acks_failed.inc)
                if loss is not None:
                    loss.copied(item.seq)
                await self.stuck.done(item.seq)
                continue
            delay = min(0.25 * 2 ** min(item.delivered, 5), 10.0)
            if kind is Failure.BLOCKED:
                m.target_blocked.set(1)
            elif kind is Failure.UNKNOWN:
                await self.stuck.failed(item.seq, perr)
            elif kind is Failure.POLICY and time.monotonic() - self.features_read > 1.0:
                with contextlib.suppress(Exception):
                    await self._read_features()  # the redelivery is built with them
            if kind is not Failure.PERMANENT:
                log.warning("%s publish of source sequence %d failed (%s): redelivery in %.1fs", ep.worker,
                            item.seq, describe(perr), delay)
            await nak(ep.source_nc, item.msg.reply, delay, m.acks_failed.inc)
        if acks:
            await ack_many(ep.source_nc, acks, m.acks_failed.inc)
            observe_many(m.processing_time, [now - t for t in started])
            m.copied_msgs.inc(len(acks))
            m.copied_bytes.inc(copied_bytes)
            self.landed += len(acks)
            m.target_blocked.set(0)

    async def _expire(self, now: float) -> None:
        """Publishes whose ack never came (lost in a disconnect) fail, and the message is redelivered."""
        while self.sent and (self.sent[0].done or now - self.sent[0].started > PUBLISH_TIMEOUT):
            item = self.sent.popleft()
            if not item.done and self.publisher.drop(item.token):
                self._finished(item, b"", PublishError("publish timed out"))
        await self._settle()


async def ensure_group_consumer(ep: Endpoints, max_in_flight: int, creating: asyncio.Lock,
                                copied_upto: int = 0) -> ConsumerInfo:
    """The shared durable: created once (first-start position), then just bound by every worker.
    After a hand-over (`resume_after`) a durable still behind it is replaced; one that comes back
    behind it anyway (another pod replacing it at the same moment) is replaced again. So is one
    behind `copied_upto`, the ack floor a running worker last read: a durable deleted by hand (or
    created again from the start by a pod that never read it) would copy the whole stream again,
    and the target's duplicate window only catches the last minutes of it.

    `creating` is held by one worker of the process at a time: workers that delete and create the
    durable together can get it back from the server with the old delivery state
    (`durable.FRESH_ATTEMPTS`). It belongs to the process's replicator, so it lives and dies with
    that replicator's event loop."""
    name = ep.profile.group_name
    handed_over = max(ep.profile.settings.resume_after or 0, copied_upto)
    async with creating:
        for _ in range(FRESH_ATTEMPTS):
            delivered, info = await _ensure_group_consumer(ep, max_in_flight, name, handed_over)
            if delivered >= handed_over:
                return info
            log.warning("%s: consumer %s came back at %d, behind %d: replacing it again", ep.worker, name,
                        delivered, handed_over)
        raise BindError(f"consumer {name} stays behind sequence {handed_over} after {FRESH_ATTEMPTS} attempts")


async def _ensure_group_consumer(ep: Endpoints, max_in_flight: int, name: str,
                                 handed_over: int) -> tuple[int, ConsumerInfo]:
    """How far the durable is past (its ack floor when kept, its delivery point when created), and
    its info."""
    try:
        info = await ep.source_js.consumer_info(ep.source_stream, name)
        floor = ack_floor(info)
        if floor >= handed_over:
            return floor, info
        # Left from before another engine copied up to `resume_after`, or created again from the
        # start by a pod that never read the floor: it would copy that again.
        log.info("%s replaces consumer %s (ack floor %d, copied up to %d)", ep.worker, name, floor, handed_over)
        with contextlib.suppress(NotFoundError):
            await ep.source_js.delete_consumer(ep.source_stream, name)
    except NotFoundError:
        if handed_over > (ep.profile.settings.resume_after or 0):
            log.warning("%s: consumer %s is gone: created again after source sequence %d, the group's ack "
                        "floor when last read (not at the start position: that would copy it all again)",
                        ep.worker, name, handed_over)
    position = ({"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": handed_over + 1}
                if handed_over else start_position(ep.profile))
    config = ConsumerConfig(
        durable_name=name,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT,
        max_ack_pending=max(20_000, max_in_flight * 8),
        filter_subject=ep.profile.settings.topic,
        max_waiting=2048,
        metadata={OWNER_NOTE: ep.profile.base_name},
        **position,  # type: ignore[arg-type]
    )
    try:
        info = await ep.source_js.add_consumer(ep.source_stream, config)
    except NATS_ERRORS:
        # Another worker or pod created it first with the same settings: bind to that one.
        info = await ep.source_js.consumer_info(ep.source_stream, name)
    return (info.delivered.stream_seq or 0 if info.delivered else 0), info
