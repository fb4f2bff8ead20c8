"""Ordered mode: the single active worker, pipelined, in order and exactly once on the target.

It keeps up to `max_in_flight` publishes in flight yet never lets a later message land before an
earlier one: every publish is chained to its predecessor (`position.py`), so if any message fails,
or another writer stores a message in between (fan-in), every later one in the window fails too.
Recovery learns what landed (from the PubAcks, or from the target when an answer was lost), drops
it, and republishes the rest, the first one alone (no predecessor check, so a server that lost
its last-id after a restart, or another writer, cannot wedge the chain). The source is acked
cumulatively (AckAll) only after the target acknowledged.

Where the target stream allows it, a backlog is written in fast-ingest batches instead, confirmed
by flow acks rather than a PubAck each (`batching.py`); the chain, the recovery and the
acknowledgement rule stay the same. A clustered target gets no chain: a message written per
message goes alone there, and a batch keeps its order by itself (`batching.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from replicator.copier import durable
from replicator.copier.admission import Run, copy_entry, take_run
from replicator.copier.batching import BATCH_WINDOW, BatchWriter, State, state
from replicator.copier.consumer_status import consumer_trouble
from replicator.copier.control import Backoff, Stopper, then, wait_wake
from replicator.copier.endpoints import (
    POISON_ATTEMPTS,
    PUBLISH_TIMEOUT,
    Endpoints,
    copies_the_rest,
    settle,
    source_identity,
    start_position,
    verdict_for,
)
from replicator.copier.failure_log import FailureLog
from replicator.copier.failures import Failure, classify
from replicator.copier.lag import LagWatch
from replicator.copier.loops import LoopGuard
from replicator.copier.loss import LossLedger
from replicator.copier.poison import StuckWatch, give_up
from replicator.copier.position import MAX_CLOCK_SKEW_NS, Resume, TargetPosition, ack_seq, resume_point
from replicator.copier.shutdown import finish
from replicator.copier.transform import MessageTransform
from replicator.copier.window import Entry, any_unsure, batch_failure, landed, reset, sent_in, settled, take_sendable
from replicator.observe.metrics import observe_many
from replicator.sampling.limiter import Pending
from replicator.transport.jetstream import Publisher, PublishError, Puller, ack
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


MAX_BYTES_IN_FLIGHT = 8 * 1024 * 1024  # payload bytes in the window, and again buffered or asked for
ADMIT_CHUNK = 1000  # messages taken per turn of the loop: sends start (and acks come in) while the
# rest of a full buffer is admitted, instead of after a whole window's worth of CPU
SIZE_GUESS = 16 * 1024  # payload bytes assumed until messages arrive: a first request sized for small
# messages would, with large ones, overrun what the source server buffers for a client (64 MB)


@dataclass
class OrderedCopier:
    """The single active worker of a topic: pipelined, in order, exactly once on the target."""

    ep: Endpoints
    stopper: Stopper = field(default_factory=Stopper)

    def __post_init__(self) -> None:
        s = self.ep.profile.settings
        self.window: deque[Entry] = deque()
        self.unsent: deque[Entry] = deque()  # the window's tail not yet published, in order
        self.configured_in_flight = s.max_in_flight
        self.wake = asyncio.Event()
        self.transform = MessageTransform(self.ep)
        self.guard = LoopGuard(self.ep, self.transform, self.ep.profile.durable_name)
        self.verdict, self.plain = verdict_for(self.ep, self.guard.looped), copies_the_rest(self.ep)
        self.publisher = Publisher(self.ep.target_nc, wake=self.wake)
        self.writer = BatchWriter(self.ep.target_nc, self.wake, self.ep.worker)
        self.puller: Puller | None = None
        self.position: TargetPosition | None = None
        self.committed = 0  # highest source sequence copied or skipped, in order
        self.confirmed_target = 0  # target sequence of the newest confirmed copy (0: unknown)
        self.bound_at_ns = 0  # wall clock of the last bind: copies sent since landed after it
        self.ack_due: str | None = None  # reply subject of `committed` while not yet acked (AckAll)
        self.lag: str | None = None  # pending count of the latest delivery, set once per batch
        self.caught_up = True  # the latest delivery had nothing pending behind it
        self.last_id: bytes | None = None  # Nats-Msg-Id of the last message published in the chain
        self.chain_open = False  # False: the next publish goes alone, without predecessor check
        self.backoff = Backoff()
        self.failures = FailureLog(self.ep)
        self.stuck = StuckWatch(self.ep, self.ep.profile.durable_name)
        self.lag_watch = LagWatch(self.ep, self.ep.profile.durable_name)  # the lag while copies cannot land
        self.avg_size = 0.0  # payload bytes per message, learned as messages arrive (0: none yet)
        # Consumer (delivery) sequence of the last message delivered: deliveries count up by one, so
        # a jump means messages were lost in transit (a cut link) and must be fetched again.
        self.last_cseq = 0
        self.gap: tuple[int, int] | None = None
        # Source-side loss (`loss.py`): counted when the consumer sees the whole stream (`account`)
        # from a delivered or resumed-after sequence (`known`); `last_ts`: the last delivery's time.
        self.losses = LossLedger(self.ep, consumer=self.ep.profile.durable_name)
        self.account = self.known = False
        self.last_ts = ""

    # ---- setup ----
    async def _read_features(self) -> None:
        self.transform.set_features(await self.writer.configure(self.ep))

    async def bind(self) -> None:
        """(Re)create the durable at the resume point: the server's redelivery order cannot be trusted
        for messages that were in flight when the previous worker died."""
        ep = self.ep
        self.transform.set_writer(await source_identity(self.ep))
        await self.guard.bind()
        await self._read_features()
        topic = ep.profile.settings.topic
        self.position = TargetPosition(ep.target_nc, ep.target_stream, self.transform.rewrite(topic),
                                       self.transform.writer, self.transform.choria)
        name = ep.profile.durable_name
        if ep.profile.settings.ephemeral:  # the Go tool's `ephemeral`: copy it all again on every start
            where = Resume(1, False, 0)
        else:
            where = await resume_point(self.position, ep.source_js, ep.source_stream, name, topic)
            handed_over = ep.profile.settings.resume_after or 0
            if handed_over >= where.next_seq:  # copied by another engine: its copies carry no provenance
                where = Resume(handed_over + 1, True, where.target_seq)
        position = durable.at(where.next_seq) if where.resuming else start_position(ep.profile)
        self.account, self.committed = await self.losses.bind(where.next_seq if where.resuming else 0,
                                                              self.transform.writer.identity)
        await durable.place(ep, position, self.max_in_flight, write_path=self.writer.path)
        self.known = where.resuming
        self.confirmed_target = where.target_seq
        self.bound_at_ns = time.time_ns()
        self.chain_open = False
        self.last_cseq = 0
        self.gap = None
        log.info("%s bound to %s/%s at %s (writer %s)", ep.worker, ep.source_stream, name,
                 f"sequence {where.next_seq}" if where.resuming else position["deliver_policy"],
                 self.transform.writer.id)

    # ---- main loop ----
    async def run(self) -> None:
        ep = self.ep
        await self.publisher.start()
        await self.writer.start()
        await self.losses.start()
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
            await finish(self)
            await self.stuck.stopped()
        finally:
            ep.ready(False)
            await self.guard.settle()
            if self.puller:
                await self.puller.stop()
            await self.writer.stop()
            await self.publisher.stop()
            await self.losses.stop()

    async def _loop(self) -> None:
        assert self.puller is not None
        puller = self.puller
        idle_checks = 0.0
        wait = 1.0
        while not self.stopper.stopping:
            # Ask for up to a whole window beyond the window (the consumer's max_ack_pending), so the
            # fetch round trip to the source overlaps the publish round trip to the target on long
            # links. Asked-for and buffered bytes have a budget of their own, as the window has: one
            # budget for both starved the source link of a window that had filled (50 ms links).
            room = 2 * self.max_in_flight - len(self.window)
            size = self.avg_size or SIZE_GUESS
            if room > 0 and (len(puller.buffer) + puller.requested) * size < MAX_BYTES_IN_FLIGHT:
                await puller.request(min(room, max(puller.batch, int(MAX_BYTES_IN_FLIGHT / size))))
            await wait_wake(self.wake, wait)
            if puller.last_status is not None:
                status, text = puller.last_status
                puller.last_status = None
                if await consumer_trouble(self, status, text):
                    continue  # rebound: what was buffered is gone
            admitted = received_bytes = 0
            limit = self._capacity()  # by bytes too: copies wait in the window while the target is slow
            while puller.buffer and len(self.window) < limit and self.gap is None and admitted < ADMIT_CHUNK:
                run = self._take_run(puller.buffer, ADMIT_CHUNK - admitted, limit)
                admitted += run.taken
                received_bytes += run.skipped_bytes + run.copied_bytes
                if run.entries:
                    alone = self._place_run(run.entries)
                    if alone is not None:
                        await alone
                if run.head is not None:
                    msg, admit = run.head, self._decided(run.head, run.tokens, run.head_seq, run.verdict)
                elif puller.buffer and not run.taken:  # out of the consumer's sequence, or a redelivery
                    msg = puller.buffer.popleft()
                    admit = self._admit(msg)
                else:
                    continue
                if admit is True or (admit is not False and await admit):
                    admitted += 1
                    received_bytes += len(msg.data)
            if admitted:
                seen = received_bytes / admitted
                self.avg_size = 0.8 * self.avg_size + 0.2 * seen if self.avg_size else seen
                puller.size_for(self.avg_size)
                self.ep.metrics.received_msgs.inc(admitted)
                self.ep.metrics.received_bytes.inc(received_bytes)
                self.lag_watch.flush(self.lag)
                if self.lag is not None:
                    self.caught_up = self.lag == "0"
                self.lag = None
            await self.pump()
            await self.drain()
            wait = await self.writer.tick(idle=not self.unsent and not puller.buffer,
                                          nothing_to_follow=self.nothing_to_follow)
            if admitted == ADMIT_CHUNK or (puller.buffer and len(self.window) < limit):
                # More is ready (let only the acks in first), or drain made room for deliveries that
                # came while the window was full: once the backlog is all delivered, nothing wakes us.
                wait = 0.0
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
                await self.lag_watch.check(now, self.committed, bool(self.window or puller.buffer), not self.caught_up)

    def _take_run(self, buffer: deque[RawMsg], most: int, limit: int) -> Run:
        """The skips and copies at the buffer's front, in one compiled call (`admission.py`); the
        skips ahead of its first copy go with what the window holds. A copy into an empty window
        with the chain not open goes alone (`_place_run`): the run takes no copy behind it."""
        window = self.window
        floor = max(self.committed, window[-1].last_seq) if window else self.committed
        room = 1 if not window and not self.chain_open else limit - len(window)
        run = take_run(buffer, self.verdict, self.transform, self.last_cseq, floor, most, room, self.plain,
                       self.account, self.known, self.last_ts)
        for first, last, before_ns, after_ns in run.gaps:
            self.losses.lost(first, last, before_ns, after_ns)
        self.last_ts, self.known = run.last_ts, self.known or bool(run.last_ts)
        if self.ep.clock is not None and run.last_ts:
            self.ep.clock.observe_ns(int(run.last_ts))
        if run.lag is not None:
            self.last_cseq, self.lag = run.last_cseq, run.lag
        if run.seq:
            self._skip(run.seq, run.reply)
        return run

    def _place_run(self, entries: list[Entry]) -> Coroutine[Any, Any, None] | None:
        """A run's copies into the window, on their way to the target (`pump`); the coroutine that
        sends the first alone when it heads the window and the chain is not open."""
        self.window.extend(entries)
        self.unsent.extend(entries)
        if not self.chain_open and self.window[0] is entries[0]:
            return self._send_alone(entries[0])
        return None

    def _admit(self, msg: RawMsg) -> bool | Coroutine[Any, Any, bool]:
        """Put a delivered message in the window (and on its way to the target); False if a
        redelivery or out of the consumer's sequence (which `take_run` leaves to this)."""
        reply = msg.reply
        tokens = ack_tokens(reply)
        cseq = int(tokens[ACK_CONSUMER_SEQ])
        last_cseq = self.last_cseq
        if cseq != last_cseq + 1:
            if cseq > last_cseq:
                # A delivery never arrived; admitting this one would let AckAll acknowledge the lost one.
                self.gap = (last_cseq + 1, cseq - 1)
            return False  # else delivered before, or by a consumer we have since replaced
        self.last_cseq = cseq
        seq = int(tokens[ACK_STREAM_SEQ])
        window = self.window
        if seq <= self.committed or (window and seq <= window[-1].last_seq):
            if seq <= self.committed and tokens[ACK_DELIVERED] != "1":
                return then(ack(self.ep.source_nc, reply, self.ep.metrics.acks_failed.inc), False)
            return False  # a redelivery of something done or already in the window
        floor = max(self.committed, window[-1].last_seq) if window else self.committed
        if self.account and self.known and seq > floor + 1:
            self.losses.lost(floor + 1, seq - 1, int(self.last_ts or "0"), int(tokens[ACK_TIMESTAMP]))
        self.last_ts, self.known = tokens[ACK_TIMESTAMP], True
        if self.ep.clock is not None:
            self.ep.clock.observe_ns(int(self.last_ts))
        self.lag = tokens[ACK_PENDING]
        return self._decided(msg, tokens, seq, self.verdict(msg, tokens, seq))

    def _decided(self, msg: RawMsg, tokens: list[str], seq: int,
                 copy: bool | Pending) -> bool | Coroutine[Any, Any, bool]:
        """A decided delivery placed or skipped; what has to wait comes back as a coroutine."""
        if copy is False:
            return self._skip(seq, msg.reply)
        if copy is True:
            return self._place(msg, tokens, seq)
        return self._admit_settled(msg, tokens, seq, copy)

    def _place(self, msg: RawMsg, tokens: list[str], seq: int) -> bool | Coroutine[Any, Any, bool]:
        alone = self._place_run([copy_entry(msg, tokens, seq, self.transform, time.monotonic())])
        return True if alone is None else then(alone, True)

    async def _admit_settled(self, msg: RawMsg, tokens: list[str], seq: int, pending: Pending) -> bool:
        """A sampling decision the shared store settles (KV: races between processes)."""
        if await settle(self.ep, pending, self.puller.buffer if self.puller is not None else None):
            placed = self._place(msg, tokens, seq)
            return placed if isinstance(placed, bool) else await placed
        return self._skip(seq, msg.reply)

    def _skip(self, seq: int, reply: str) -> bool:
        """A delivery not copied (sampled out, too old): done when the copy ahead of it is."""
        if self.window:
            self.window[-1].skipped_seq, self.window[-1].skipped_reply = seq, reply
        else:
            self.committed, self.ack_due = seq, reply
        return True

    async def pump(self) -> None:
        """Publish the unsent tail of the window, chained, in order: into a fast-ingest batch when
        the writer takes it (one is open, or the backlog is worth one), else one by one."""
        unsent, writer = self.unsent, self.writer
        near_limit = self.ep.target_nc._max_payload - 128  # the chain line and margin: checked per message
        while self.chain_open and unsent:
            if not unsent[0].copy.chainable:
                self.chain_open = False  # it goes alone once it heads the window; the rest wait for it
                break
            room = writer.room(len(unsent), self._capacity())
            if room == 0:
                break  # flow control: the batch's acknowledgements wake us
            chained = writer.chained
            taken, messages, predecessor = take_sendable(unsent, room, near_limit, self.last_id, chained)
            if not taken:  # per message (the path, or a message too large to risk in a batch)
                if not chained and self.window[0] is not unsent[0]:
                    break  # unchained: alone, once everything before it landed (`batching.py`)
                entry = unsent.popleft()
                entry.future = await self._publish(entry, self.last_id if chained else None)
                self.last_id = entry.copy.msg_id
                continue
            sent_in(taken, *await writer.send(messages, self._capacity()))  # (batch, its first sequence)
            self.last_id = predecessor

    @property
    def nothing_to_follow(self) -> bool:
        """No copy is about to follow the open batch's last: the source has nothing pending, or its
        deliveries are being skipped (sampling). Skips are acknowledged only with the copy ahead
        of them, so a batch held open for more copies would hold the source consumer at its
        max_ack_pending, and the copier with it, until the batch commits."""
        return self.caught_up or bool(self.window and self.window[-1].skipped_seq)

    @property
    def max_in_flight(self) -> int:
        """The window: `max_in_flight`, times `BATCH_WINDOW` while writing batches, where messages
        in flight cost the target no acknowledgement each and long links need a deep window (not
        during a fan-in cool-down: a broken chain wastes the whole window)."""
        return self.configured_in_flight * (BATCH_WINDOW if self.writer.batching else 1)

    def _capacity(self) -> int:
        """Messages the window holds at most, by count and by bytes."""
        return max(1, min(self.max_in_flight, int(MAX_BYTES_IN_FLIGHT / (self.avg_size or SIZE_GUESS))))

    async def _publish(self, entry: Entry, predecessor: bytes | None) -> asyncio.Future[bytes]:
        copy = entry.copy
        entry.sent_at = time.monotonic()
        entry.attempts += 1
        return await self.publisher.publish(copy.subject, copy.payload, copy.block(predecessor))

    async def _send_alone(self, entry: Entry) -> None:
        """Publish without a predecessor check and wait: the safe way to (re)start the chain."""
        fut = await self._publish(entry, None)
        entry.future = fut
        try:
            await asyncio.wait_for(asyncio.shield(fut), PUBLISH_TIMEOUT)
        except TimeoutError:
            fut.cancel()
            return
        except PublishError:
            return
        if self.unsent and self.unsent[0] is entry:
            self.unsent.popleft()
        self.last_id = entry.copy.msg_id
        self.chain_open = True
        await self.pump()  # anything admitted behind it while we waited can now go, chained

    async def drain(self) -> None:
        """Retire the completed prefix of the window in order, then ack the source once (AckAll)."""
        ep = self.ep
        m = ep.metrics
        now = time.monotonic()
        copied = copied_bytes = 0
        received: list[float] = []
        failed: tuple[Entry, PublishError] | None = None
        window = self.window
        last_ack = b""
        last: Entry | None = None
        while window:
            head = window[0]
            batch = head.batch
            if batch is not None:  # confirmed by the batch's flow acks or its commit
                if head.bseq > batch.acked:
                    st = state(batch, head.bseq)
                    if st is State.PENDING:
                        break
                    if st is not State.LANDED:
                        failed = batch_failure(window, batch, head)
                        break
                if head.bseq == batch.sent and batch.pub_ack is not None:
                    last_ack = batch.pub_ack
            else:
                fut = head.future
                if fut is None or not fut.done():
                    break
                err = fut.exception() if not fut.cancelled() else PublishError("publish timed out")
                if err is not None:
                    failed = head, err if isinstance(err, PublishError) else PublishError(str(err))
                    break
                last_ack = fut.result()
            copied_bytes += len(head.msg.data)
            received.append(head.received)
            last = window.popleft()
        if last is not None:
            self.committed, self.ack_due = last.last_seq, last.last_reply
            copied = len(received)
            observe_many(m.processing_time, [now - r for r in received])
            self.confirmed_target = ack_seq(last_ack) or self.confirmed_target
            self._count_copied(copied, copied_bytes)
            self.failures.landed()
        if self.stuck.since:
            await self.stuck.settled_upto(self.committed)
        if self.ack_due is not None:
            reply, self.ack_due = self.ack_due, None
            m.current_sequence.set(self.committed)
            self.backoff.reset()
            await ack(ep.source_nc, reply, m.acks_failed.inc)
        batch = self.writer.batch
        if failed is None and batch is not None and batch.error is not None and not any(
                e.batch is batch for e in window):
            self.writer.abandon()  # it failed after confirming all it holds: nothing to recover
        if failed is not None:
            await self._recover(*failed)
        elif not self.chain_open and window and window[0].future is None and window[0].batch is None:
            await self._send_alone(window[0])  # a message that cannot be chained now heads the window
        elif last is not None and not self.writer.chained and self.unsent:
            await self.pump()  # unchained: a copy waiting for the one ahead of it to land can go now

    def _count_copied(self, n: int, size: int) -> None:
        if n:
            self.ep.metrics.copied_msgs.inc(n)
            self.ep.metrics.copied_bytes.inc(size)

    async def _check_stalled(self, now: float) -> None:
        """A publish whose ack never came (lost in a disconnect) counts as failed."""
        await self.writer.recheck(self.ep, now)
        if not self.window:
            return
        head = self.window[0]
        if head.future is not None and not head.future.done() and now - head.sent_at > PUBLISH_TIMEOUT:
            await self._recover(head, PublishError("publish timed out"))
        elif not self.chain_open:
            await self.restart_chain()

    async def restart_chain(self) -> None:
        """The head goes alone (unchained) when nothing of the window is on its way."""
        first = self.window[0] if self.window else None
        if first is not None and first.future is None and first.batch is None:
            await self._send_alone(first)

    async def _recover(self, head: Entry, err: PublishError) -> None:
        """The head failed: settle the window, learn what landed, and republish the rest in order.

        The caller's loop drains afterwards (no recursion: a long outage or busy fan-in would
        otherwise nest one frame per failure)."""
        ep = self.ep
        m = ep.metrics
        path = self.writer.path_failure(err)  # the target takes no batches: not the message's fault
        kind = Failure.TRANSIENT if path else classify(err)
        if not path:
            self.failures.failed(head.seq, head.attempts, err, kind)
        if kind is Failure.UNKNOWN:
            await self.stuck.failed(head.seq, err)
        # Let whatever is still in flight settle, so the target's state stops moving.
        pending = [e.future for e in self.window if e.future is not None and not e.future.done()]
        if pending:
            await asyncio.wait(pending, timeout=PUBLISH_TIMEOUT)
        unsure = any_unsure(self.window)
        self.publisher.forget_all()
        self.writer.abandon(err)
        await self.writer.show(self.ep)
        upto: int | None = None
        if unsure:  # an answer was lost: only the target can tell what landed
            upto = await self._landed_up_to()
            if upto is None:
                self._reset_window()
                await self.stopper.sleep(self.backoff.next())
                return
        # Explicit answers tell it all: the chain makes what landed a prefix, acked ones done.
        while self.window and ((upto is not None and self.window[0].seq <= upto)
                               or landed(self.window[0])):
            done = self.window.popleft()
            settled(done.future)
            self._count_copied(1, len(done.msg.data))
            self.committed, self.ack_due = done.last_seq, done.last_reply
        if kind is Failure.POLICY:
            await self._refresh_features()
        if self.window and self.window[0] is head and kind is Failure.PERMANENT and head.attempts >= POISON_ATTEMPTS:
            self.window.popleft()
            self.committed, self.ack_due = head.last_seq, head.last_reply
            await give_up(ep, self.publisher, self.transform.writer, head.msg, head.seq, head.ts, head.copy.subject,
                          err, head.attempts)
        self._reset_window()
        if self.committed:
            m.current_sequence.set(self.committed)
        if kind is not Failure.CHAIN and not path:  # another writer in between: re-send at once
            await self.stopper.sleep(self.backoff.next())
        first = self.window[0] if self.window else None
        if first is not None and not self.stopper.stopping:
            await self._send_alone(first)

    def _reset_window(self) -> None:
        self.unsent = reset(self.window)
        self.chain_open = False

    async def _refresh_features(self) -> None:
        """The target's features changed (TTL, roll-ups, counters): rebuild what is to be sent."""
        try:
            await self._read_features()
        except Exception as err:
            log.warning("%s cannot read the target stream's configuration: %s", self.ep.worker, err)
            return
        for e in self.window:
            e.copy = self.transform.build(e.msg, e.seq, e.ts)

    async def _landed_up_to(self) -> int | None:
        assert self.position is not None
        try:
            landed = await self.position.last_landed(
                floor=self.committed, scan=True, since_seq=self.confirmed_target,
                not_before_ns=self.bound_at_ns - MAX_CLOCK_SKEW_NS, legacy=(self.committed, self.committed))
        except Exception as err:
            log.warning("%s cannot read the target's last message yet: %s", self.ep.worker, err)
            return None
        if landed.target_seq:
            self.confirmed_target = landed.target_seq
        return landed.source_seq

    async def _rebind(self, *, delete: bool) -> None:
        """Point the durable right after what we hold (window or committed) and pull afresh.

        `delete`: the consumer still exists but lost deliveries in transit; it is replaced, and the
        puller takes a new inbox so deliveries still on their way from the old one are dropped
        rather than mistaken for new ones.
        """
        assert self.puller is not None
        ep = self.ep
        resume = max(self.committed, self.window[-1].last_seq if self.window else 0) + 1
        try:
            await durable.place(ep, durable.at(resume), self.max_in_flight, delete=delete,
                                write_path=self.writer.path)
            await self.puller.restart()
            self.last_cseq = 0
            self.gap = None
            ep.metrics.consumer_recreated.inc()
            log.info("%s recreated consumer %s at sequence %d", ep.worker, ep.profile.durable_name, resume)
        except Exception as err:
            log.warning("%s cannot recreate consumer: %s", ep.worker, err)
            await self.stopper.sleep(self.backoff.next())
