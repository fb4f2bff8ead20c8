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

from replicator.copier.binding import BIND_ERRORS, Binding
from replicator.copier.control import Backoff, Stopper, then, wait_wake
from replicator.copier.endpoints import Endpoints, copies_the_rest, settle, verdict_for
from replicator.copier.failure_log import FailureLog
from replicator.copier.lag import LagWatch
from replicator.copier.loops import LoopGuard
from replicator.copier.pipeline import MAX_BYTES_IN_FLIGHT, Pipeline
from replicator.copier.poison import StuckWatch
from replicator.copier.recovery import Recovery
from replicator.copier.transform import MessageTransform
from replicator.sampling.limiter import Pending
from replicator.transport.jetstream import ack
from replicator.transport.wire import ACK_CONSUMER_SEQ, ACK_DELIVERED, ACK_STREAM_SEQ, RawMsg, ack_tokens

log = logging.getLogger(__name__)


ADMIT_CHUNK = 1000  # messages taken per turn of the loop: sends start (and acks come in) while the
# rest of a full buffer is admitted, instead of after a whole window's worth of CPU


@dataclass
class OrderedCopier:
    """The single active worker of a topic: pipelined, in order, exactly once on the target.

    It composes the binding to the source (`binding.py`), the window on its way to the target
    (`pipeline.py`) and the recovery from failed publishes (`recovery.py`), and admits the
    deliveries from the one into the other."""

    ep: Endpoints
    stopper: Stopper = field(default_factory=Stopper)

    def __post_init__(self) -> None:
        ep = self.ep
        self.wake = asyncio.Event()
        self.backoff = Backoff()
        self.stuck = StuckWatch(ep, ep.profile.durable_name)  # `/readyz` reads it
        failures = FailureLog(ep)
        self.transform = MessageTransform(ep)
        self.guard = LoopGuard(ep, self.transform, ep.profile.durable_name)
        self.verdict, self.plain = verdict_for(ep, self.guard.looped), copies_the_rest(ep)
        self.pipeline = Pipeline(ep, self.wake, self.transform, failures, self.stuck, self.backoff)
        self.binding = Binding(ep, self.pipeline, self.transform, self.guard, self.stopper, self.backoff)
        self.recovery = Recovery(ep, self.pipeline, self.binding, self.transform, failures, self.stuck,
                                 self.stopper, self.backoff)
        self.lag_watch = LagWatch(ep, ep.profile.durable_name)  # the lag while copies cannot land

    async def run(self) -> None:
        ep = self.ep
        await self.pipeline.start()
        await self.binding.start()
        try:
            while not self.stopper.stopping:
                try:
                    await self.binding.bind()
                    break
                except BIND_ERRORS as err:
                    log.warning("%s cannot bind consumer: %s", ep.worker, err)
                    await self.stopper.sleep(self.backoff.next())
            self.backoff.reset()
            await self.binding.pull(self.wake)
            ep.ready(True)
            # Its own task: a recovery holds the loop for tens of seconds while the target is down
            # (settling, reading what landed, a publish alone), and the gauge must not freeze then.
            lag_task = asyncio.create_task(self._watch_lag(), name=f"{ep.worker}-lag")
            try:
                await self._loop()
            finally:
                lag_task.cancel()
                await asyncio.gather(lag_task, return_exceptions=True)
            await self.recovery.finish()
            await self.stuck.stopped()
        finally:
            ep.ready(False)
            await self.guard.settle()
            await self.binding.stop()
            await self.pipeline.stop()

    async def _loop(self) -> None:
        binding, pipeline, recovery = self.binding, self.pipeline, self.recovery
        puller = binding.puller
        assert puller is not None
        idle_checks = 0.0
        wait = 1.0
        while not self.stopper.stopping:
            # Ask for up to a whole window beyond the window (the consumer's max_ack_pending), so the
            # fetch round trip to the source overlaps the publish round trip to the target on long
            # links. Asked-for and buffered bytes have a budget of their own, as the window has: one
            # budget for both starved the source link of a window that had filled (50 ms links).
            room = 2 * pipeline.max_in_flight - len(pipeline.window)
            size = pipeline.size
            if room > 0 and (len(puller.buffer) + puller.requested) * size < MAX_BYTES_IN_FLIGHT:
                await puller.request(min(room, max(puller.batch, int(MAX_BYTES_IN_FLIGHT / size))))
            await wait_wake(self.wake, wait)
            if puller.last_status is not None:
                status, text = puller.last_status
                puller.last_status = None
                if await binding.answer(status, text):
                    continue  # rebound: what was buffered is gone
            limit = pipeline.capacity()  # by bytes too: copies wait in the window while the target is slow
            admitted = await self._admit_buffered(puller.buffer, limit)
            await pipeline.pump()
            await recovery.drain()
            wait = await pipeline.writer.tick(idle=not pipeline.unsent and not puller.buffer,
                                              nothing_to_follow=self.nothing_to_follow)
            if admitted == ADMIT_CHUNK or (puller.buffer and len(pipeline.window) < limit):
                # More is ready (let only the acks in first), or drain made room for deliveries that
                # came while the window was full: once the backlog is all delivered, nothing wakes us.
                wait = 0.0
            if binding.gap is not None:
                first, last = binding.gap
                log.warning("%s deliveries %d..%d of consumer %s were lost in transit: fetching them again",
                            self.ep.worker, first, last, self.ep.profile.durable_name)
                await binding.rebind(delete=True)
                continue
            now = time.monotonic()
            if now - idle_checks > 1.0:
                idle_checks = now
                await recovery.check_stalled(now)

    async def _watch_lag(self) -> None:
        binding, pipeline = self.binding, self.pipeline
        while not self.stopper.stopping:
            await self.stopper.sleep(1.0)
            buffered = binding.puller is not None and bool(binding.puller.buffer)
            await self.lag_watch.check(time.monotonic(), pipeline.committed, bool(pipeline.window) or buffered,
                                       not binding.caught_up)

    @property
    def nothing_to_follow(self) -> bool:
        """No copy is about to follow the open batch's last: the source has nothing pending, or its
        deliveries are being skipped (sampling). Skips are acknowledged only with the copy ahead
        of them, so a batch held open for more copies would hold the source consumer at its
        max_ack_pending, and the copier with it, until the batch commits."""
        return self.binding.caught_up or self.pipeline.skips_waiting

    # ---- admission: deliveries from the binding into the window ----
    async def _admit_buffered(self, buffer: deque[RawMsg], limit: int) -> int:
        """Admit what was delivered, up to `ADMIT_CHUNK` and while the window has room below
        `limit`; the number admitted, counted with its bytes and the size learned from them."""
        binding, pipeline = self.binding, self.pipeline
        admitted = received_bytes = 0
        while buffer and len(pipeline.window) < limit and binding.gap is None and admitted < ADMIT_CHUNK:
            run = binding.take_run(buffer, self.verdict, self.plain, ADMIT_CHUNK - admitted, limit)
            admitted += run.taken
            received_bytes += run.skipped_bytes + run.copied_bytes
            if run.entries:
                alone = pipeline.place_run(run.entries)
                if alone is not None:
                    await alone
            if run.head is not None:
                msg, admit = run.head, self._decided(run.head, run.tokens, run.head_seq, run.verdict)
            elif buffer and not run.taken:  # out of the consumer's sequence, or a redelivery
                msg = buffer.popleft()
                admit = self._admit(msg)
            else:
                continue
            if admit is True or (admit is not False and await admit):
                admitted += 1
                received_bytes += len(msg.data)
        if admitted:
            pipeline.learn_size(received_bytes / admitted)
            assert binding.puller is not None
            binding.puller.size_for(pipeline.avg_size)
            self.ep.metrics.received_msgs.inc(admitted)
            self.ep.metrics.received_bytes.inc(received_bytes)
            self.lag_watch.flush(binding.take_lag())
        return admitted

    def _admit(self, msg: RawMsg) -> bool | Coroutine[Any, Any, bool]:
        """Put a delivered message in the window (and on its way to the target); False if a
        redelivery or out of the consumer's sequence (which `take_run` leaves to this)."""
        reply = msg.reply
        tokens = ack_tokens(reply)
        if not self.binding.in_sequence(int(tokens[ACK_CONSUMER_SEQ])):
            return False
        seq = int(tokens[ACK_STREAM_SEQ])
        pipeline = self.pipeline
        if seq <= pipeline.floor:
            if seq <= pipeline.committed and tokens[ACK_DELIVERED] != "1":
                return then(ack(self.ep.source_nc, reply, self.ep.metrics.acks_failed.inc), False)
            return False  # a redelivery of something done or already in the window
        self.binding.delivered(tokens, seq)
        return self._decided(msg, tokens, seq, self.verdict(msg, tokens, seq))

    def _decided(self, msg: RawMsg, tokens: list[str], seq: int,
                 copy: bool | Pending) -> bool | Coroutine[Any, Any, bool]:
        """A decided delivery placed or skipped; what has to wait comes back as a coroutine."""
        if copy is False:
            self.pipeline.skip(seq, msg.reply)
            return True
        if copy is True:
            alone = self.pipeline.place(msg, tokens, seq)
            return True if alone is None else then(alone, True)
        return self._admit_settled(msg, tokens, seq, copy)

    async def _admit_settled(self, msg: RawMsg, tokens: list[str], seq: int, pending: Pending) -> bool:
        """A sampling decision the shared store settles (KV: races between processes)."""
        puller = self.binding.puller
        if await settle(self.ep, pending, puller.buffer if puller is not None else None):
            alone = self.pipeline.place(msg, tokens, seq)
            if alone is not None:
                await alone
            return True
        self.pipeline.skip(seq, msg.reply)
        return True
