"""Ordered mode's recovery from a failed publish, and its clean stop.

**Recovery.** The window's head failed (or its ack never came): whatever is still in flight is let
settle, so the target stops moving; what landed is learned from the answers (the chain makes it a
prefix) or, when an answer was lost, from the target (`position.py`), and retired; a poison message
is given up after `POISON_ATTEMPTS` (`poison.py`); the rest is published again in order, the first
one alone (no predecessor check, so a server that lost its last id after a restart, or another
writer, cannot wedge the chain). The caller's loop drains afterwards (no recursion: a long outage
or a busy fan-in would otherwise nest one frame per failure).

**Clean stop.** What is in flight is finished and acknowledged (bounded in time), then the durable
is left exactly at the copy position, so the next start needs no search of the target.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from replicator.copier import durable
from replicator.copier.binding import Binding
from replicator.copier.control import Backoff, Stopper, wait_wake
from replicator.copier.endpoints import POISON_ATTEMPTS, PUBLISH_TIMEOUT, Endpoints
from replicator.copier.failure_log import FailureLog
from replicator.copier.failures import Failure, classify
from replicator.copier.pipeline import Pipeline
from replicator.copier.poison import StuckWatch, give_up
from replicator.copier.position import MAX_CLOCK_SKEW_NS
from replicator.copier.transform import MessageTransform
from replicator.copier.window import Entry
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.jetstream import PublishError

log = logging.getLogger("replicator.copier.ordered")

STOP_TIMEOUT = PUBLISH_TIMEOUT * 2  # a clean stop waits this long at most for what is in flight


@dataclass(eq=False)
class Recovery:
    """Settles an ordered copier's failed publishes and finishes its window at a clean stop."""

    ep: Endpoints
    pipeline: Pipeline
    binding: Binding  # where the target is searched: its position, and since when
    transform: MessageTransform
    failures: FailureLog
    stuck: StuckWatch
    stopper: Stopper
    backoff: Backoff

    async def drain(self) -> None:
        """Retire what completed (`Pipeline.drain`) and recover from the failure that stopped it."""
        failed = await self.pipeline.drain()
        if failed is not None:
            await self.recover(*failed)

    async def check_stalled(self, now: float) -> None:
        """A publish whose ack never came (lost in a disconnect) counts as failed; a chain that is
        not open is restarted."""
        pipeline = self.pipeline
        await pipeline.writer.recheck(self.ep, now)
        head = pipeline.overdue(now)
        if head is not None:
            await self.recover(head, PublishError("publish timed out"))
        else:
            await pipeline.restart_chain()

    async def recover(self, head: Entry, err: PublishError) -> None:
        """The head failed: settle the window, learn what landed, and republish the rest in order."""
        ep, pipeline = self.ep, self.pipeline
        path = pipeline.writer.path_failure(err)  # the target takes no batches: not the message's fault
        kind = Failure.TRANSIENT if path else classify(err)
        if not path:
            self.failures.failed(head.seq, head.attempts, err, kind)
        if kind is Failure.UNKNOWN:
            await self.stuck.failed(head.seq, err)
        # Let whatever is still in flight settle, so the target's state stops moving.
        pending = pipeline.in_flight()
        if pending:
            await asyncio.wait(pending, timeout=PUBLISH_TIMEOUT)
        upto: int | None = None
        if await pipeline.abandon(err):  # an answer was lost: only the target can tell what landed
            upto = await self.landed_up_to()
            if upto is None:
                pipeline.reset()
                await self.stopper.sleep(self.backoff.next())
                return
        pipeline.retire_landed(upto)  # explicit answers tell it all: acked ones are done
        if kind is Failure.POLICY:
            await self.refresh_features()
        window = pipeline.window
        if window and window[0] is head and kind is Failure.PERMANENT and head.attempts >= POISON_ATTEMPTS:
            pipeline.drop_head()
            await give_up(ep, pipeline.publisher, self.transform.writer, head.msg, head.seq, head.ts,
                          head.copy.subject, err, head.attempts)
        pipeline.reset()
        if pipeline.committed:
            ep.metrics.current_sequence.set(pipeline.committed)
        if kind is not Failure.CHAIN and not path:  # another writer in between: re-send at once
            await self.stopper.sleep(self.backoff.next())
        if not self.stopper.stopping:
            await pipeline.restart_chain()

    async def refresh_features(self) -> None:
        """The target's features changed (TTL, roll-ups, counters): rebuild what is to be sent."""
        try:
            await self.pipeline.configure()
        except NATS_ERRORS as err:
            log.warning("%s cannot read the target stream's configuration: %s", self.ep.worker, err)
            return
        self.pipeline.rebuild()

    async def landed_up_to(self) -> int | None:
        """The newest source sequence of this writer on the target (None: the target cannot tell now)."""
        pipeline, position = self.pipeline, self.binding.position
        assert position is not None
        committed = pipeline.committed
        try:
            landed = await position.last_landed(
                floor=committed, scan=True, since_seq=pipeline.confirmed_target,
                not_before_ns=self.binding.bound_at_ns - MAX_CLOCK_SKEW_NS, legacy=(committed, committed))
        except NATS_ERRORS as err:
            log.warning("%s cannot read the target's last message yet: %s", self.ep.worker, err)
            return None
        pipeline.rebase_target(landed.target_seq)
        return landed.source_seq

    async def finish(self) -> None:
        """The clean stop: nothing more is admitted; what is in the window lands (or the time is up),
        then the durable is parked at the copy position."""
        pipeline, writer = self.pipeline, self.pipeline.writer
        deadline = time.monotonic() + STOP_TIMEOUT
        self.binding.drop_buffered()
        await self.drain()  # skips admitted last are acked here even with an empty window
        while pipeline.window and time.monotonic() < deadline:
            await pipeline.restart_chain()
            await pipeline.pump()
            await writer.commit_now()  # its PubAck confirms the batch's tail
            pending = pipeline.in_flight()
            in_batch = pipeline.batch_unconfirmed
            if pending:
                await asyncio.wait(pending, timeout=1.0)
            elif in_batch:
                await wait_wake(pipeline.wake, 0.2)
                await writer.tick(idle=True)  # a silent batch fails (and is recovered) here
            before = len(pipeline.window)
            await self.drain()
            if len(pipeline.window) == before and not pending and not in_batch:
                break
        ep = self.ep
        with contextlib.suppress(*NATS_ERRORS):  # the acks are sent; a flush failing changes nothing
            await ep.source_nc.flush(timeout=2)
        if not pipeline.window and pipeline.committed:
            with contextlib.suppress(*NATS_ERRORS, durable.StaleDurable):  # a restart searches the target
                await durable.park(ep, pipeline.committed, pipeline.max_in_flight, writer.path)
