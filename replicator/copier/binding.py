"""Ordered mode's binding to the source: the durable, always (re)placed at an explicit position
(`durable.py`), its puller, and what its deliveries have said so far.

Deliveries count up by one in consumer (delivery) sequence: a jump means some were lost in transit
(a cut link) and must be fetched again (`gap`: the durable is placed again after what the copier
holds). Stream sequences tell of loss at the source (`loss.py`), counted when the consumer sees the
whole stream from a delivered or resumed-after sequence. A consumer deleted or gone is placed
again where the copy is; a source stream deleted and created again is copied from the start
position, its window dropped: its sequences are another stream's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass

from replicator.copier import durable
from replicator.copier.admission import Run, take_run
from replicator.copier.control import Backoff, Stopper
from replicator.copier.endpoints import Endpoints, Verdict, source_identity, start_position
from replicator.copier.loops import LoopGuard
from replicator.copier.loss import LossLedger
from replicator.copier.pipeline import Pipeline
from replicator.copier.position import Resume, TargetPosition, resume_point
from replicator.copier.transform import MessageTransform
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.jetstream import Puller
from replicator.transport.streams import StreamSetupError
from replicator.transport.wire import ACK_PENDING, ACK_TIMESTAMP, RawMsg

log = logging.getLogger("replicator.copier.ordered")

# What binding can meet that a retry may cure: the servers (NATS_ERRORS), the source stream missing
# (StreamSetupError), a durable that came back with an old delivery state (durable.StaleDurable).
BIND_ERRORS: tuple[type[BaseException], ...] = (*NATS_ERRORS, StreamSetupError, durable.StaleDurable)


@dataclass(eq=False)
class Binding:
    """The durable consumer an ordered copier pulls from, and the state of its deliveries."""

    ep: Endpoints
    pipeline: Pipeline  # configured, rebased and, for a new stream, emptied by a bind
    transform: MessageTransform  # given the source stream's writer identity by a bind
    guard: LoopGuard
    stopper: Stopper
    backoff: Backoff

    def __post_init__(self) -> None:
        ep = self.ep
        self.puller: Puller | None = None
        self.position: TargetPosition | None = None
        self.bound_at_ns = 0  # wall clock of the last bind: copies sent since landed after it
        self.last_cseq = 0  # consumer sequence of the last message delivered
        self.gap: tuple[int, int] | None = None  # deliveries lost in transit: fetch them again
        # Source-side loss (`loss.py`): counted when the consumer sees the whole stream (`account`)
        # from a delivered or resumed-after sequence (`known`); `last_ts`: the last delivery's time.
        self.losses = LossLedger(ep, consumer=ep.profile.durable_name)
        self.account = self.known = False
        self.last_ts = ""
        self.lag: str | None = None  # pending count of the latest delivery, taken once per turn
        self.caught_up = True  # the latest delivery had nothing pending behind it

    async def bind(self) -> None:
        """(Re)create the durable at the resume point: the server's redelivery order cannot be trusted
        for messages that were in flight when the previous worker died."""
        ep, pipeline = self.ep, self.pipeline
        self.transform.set_writer(await source_identity(ep))
        await self.guard.bind()
        await pipeline.configure()
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
        self.account, committed = await self.losses.bind(where.next_seq if where.resuming else 0,
                                                         self.transform.writer.identity)
        pipeline.rebase(committed, where.target_seq)
        await durable.place(ep, position, pipeline.max_in_flight, write_path=pipeline.writer.path)
        self.known = where.resuming
        self.bound_at_ns = time.time_ns()
        self.last_cseq = 0
        self.gap = None
        log.info("%s bound to %s/%s at %s (writer %s)", ep.worker, ep.source_stream, name,
                 f"sequence {where.next_seq}" if where.resuming else position["deliver_policy"],
                 self.transform.writer.id)

    async def pull(self, wake: asyncio.Event) -> Puller:
        """Start pulling from the bound durable; new deliveries and statuses set `wake`."""
        ep = self.ep
        self.puller = Puller(ep.source_nc, ep.source_stream, ep.profile.durable_name,
                             batch=ep.profile.settings.batch, wake=wake, api_prefix=ep.api_prefix)
        await self.puller.start()
        return self.puller

    def drop_buffered(self) -> None:
        """At a clean stop: what was pulled and not yet admitted is left to the next start."""
        if self.puller is not None:
            self.puller.buffer.clear()

    async def start(self) -> None:
        await self.losses.start()

    async def stop(self) -> None:
        if self.puller:
            await self.puller.stop()
        await self.losses.stop()

    async def rebind(self, *, delete: bool) -> None:
        """Point the durable right after what the copier holds (window or committed) and pull afresh.

        `delete`: the consumer still exists but lost deliveries in transit; it is replaced, and the
        puller takes a new inbox so deliveries still on their way from the old one are dropped
        rather than mistaken for new ones.
        """
        assert self.puller is not None
        ep, pipeline = self.ep, self.pipeline
        resume = pipeline.floor + 1
        try:
            await durable.place(ep, durable.at(resume), pipeline.max_in_flight, delete=delete,
                                write_path=pipeline.writer.path)
            await self.puller.restart()
            self.last_cseq = 0
            self.gap = None
            ep.metrics.consumer_recreated.inc()
            log.info("%s recreated consumer %s at sequence %d", ep.worker, ep.profile.durable_name, resume)
        except BIND_ERRORS as err:
            log.warning("%s cannot recreate consumer: %s", ep.worker, err)
            await self.stopper.sleep(self.backoff.next())

    async def answer(self, status: int, text: str) -> bool:
        """409s: the consumer was deleted or lost leadership; 503: it is gone. Rebind where we are,
        or from the start position when the source stream was deleted and created again. False
        for any other status (the copy goes on: a `continue` per status could starve it)."""
        ep = self.ep
        gone = status == 503 or "deleted" in text.lower()
        if not gone and not (status == 409 and "leadership" in text.lower()):
            log.warning("%s consumer status %d %s", ep.worker, status, text)
            return False
        try:
            identity = await source_identity(ep)
        except BIND_ERRORS as err:  # the stream unreachable or missing: the loop retries after a backoff
            log.warning("%s source stream %s unavailable (%s): retrying", ep.worker, ep.source_stream, err)
            await self.stopper.sleep(self.backoff.next())
            return True
        if identity == self.transform.writer.identity:
            log.warning("%s consumer status %d %s", ep.worker, status, text)
            await self.rebind(delete=False)
            return True
        log.warning("%s source stream %s was deleted and created again: copying the new stream from its "
                    "start position", ep.worker, ep.source_stream)
        self.pipeline.forget()
        try:
            await self.bind()
            assert self.puller is not None
            await self.puller.restart()
        except BIND_ERRORS as err:  # a failed bind is retried, the copy loop must go on
            log.warning("%s cannot bind consumer: %s", ep.worker, err)
            await self.stopper.sleep(self.backoff.next())
        return True

    # ---- deliveries ----
    def take_run(self, buffer: deque[RawMsg], verdict: Verdict, plain: bool, most: int, limit: int) -> Run:
        """The skips and copies at the buffer's front, in one compiled call (`admission.py`), from
        this binding's consumer sequence on and past what the copier holds; the skips ahead of its
        first copy go with what the window holds. A copy into an empty window with the chain not
        open goes alone (`Pipeline.place_run`): the run takes no copy behind it."""
        pipeline = self.pipeline
        run = take_run(buffer, verdict, self.transform, self.last_cseq, pipeline.floor, most, pipeline.room(limit),
                       plain, self.account, self.known, self.last_ts)
        for first, last, before_ns, after_ns in run.gaps:
            self.losses.lost(first, last, before_ns, after_ns)
        self.last_ts, self.known = run.last_ts, self.known or bool(run.last_ts)
        if self.ep.clock is not None and run.last_ts:
            self.ep.clock.observe_ns(int(run.last_ts))
        if run.lag is not None:
            self.last_cseq, self.lag = run.last_cseq, run.lag
        if run.seq:
            pipeline.skip(run.seq, run.reply)
        return run

    def in_sequence(self, cseq: int) -> bool:
        """Is this delivery the consumer's next? A later one means deliveries never arrived
        (`gap`): admitting it would let AckAll acknowledge the lost ones. An earlier one was
        delivered before, or by a consumer since replaced."""
        last_cseq = self.last_cseq
        if cseq != last_cseq + 1:
            if cseq > last_cseq:
                self.gap = (last_cseq + 1, cseq - 1)
            return False
        self.last_cseq = cseq
        return True

    def delivered(self, tokens: list[str], seq: int) -> None:
        """A new delivery of stream sequence `seq` (ack `tokens`) past what the copier holds: a jump
        is source-side loss when the consumer sees the whole stream; its time and pending count."""
        floor = self.pipeline.floor
        if self.account and self.known and seq > floor + 1:
            self.losses.lost(floor + 1, seq - 1, int(self.last_ts or "0"), int(tokens[ACK_TIMESTAMP]))
        self.last_ts, self.known = tokens[ACK_TIMESTAMP], True
        if self.ep.clock is not None:
            self.ep.clock.observe_ns(int(self.last_ts))
        self.lag = tokens[ACK_PENDING]

    def take_lag(self) -> str | None:
        """The latest delivery's pending count since the last turn (None: no delivery)."""
        lag, self.lag = self.lag, None
        if lag is not None:
            self.caught_up = lag == "0"
        return lag
