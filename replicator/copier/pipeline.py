"""Ordered mode's window at work: copies placed in it in source order, published chained (`pump`),
retired in order with the source acknowledged once per turn (`drain`, AckAll).

`window.py` holds the entries and what is known of each; this holds the window itself and where
the copy stands on the target: the highest source sequence done (`committed`), its ack subject
while not yet acknowledged, the newest confirmed target sequence and the chain's last id. A failed
publish is handed back by `drain` for `recovery.py`, which uses the methods below to settle it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from replicator.copier.admission import copy_entry
from replicator.copier.batching import BATCH_WINDOW, BatchWriter, State, state
from replicator.copier.control import Backoff
from replicator.copier.endpoints import PUBLISH_TIMEOUT, Endpoints
from replicator.copier.failure_log import FailureLog
from replicator.copier.poison import StuckWatch
from replicator.copier.position import ack_seq
from replicator.copier.transform import MessageTransform
from replicator.copier.window import Entry, any_unsure, batch_failure, landed, reset, sent_in, settled, take_sendable
from replicator.observe.metrics import observe_many
from replicator.transport.jetstream import Publisher, PublishError, ack
from replicator.transport.wire import RawMsg

MAX_BYTES_IN_FLIGHT = 8 * 1024 * 1024  # payload bytes in the window, and again buffered or asked for
SIZE_GUESS = 16 * 1024  # payload bytes assumed until messages arrive: a first request sized for small
# messages would, with large ones, overrun what the source server buffers for a client (64 MB)

Failed = tuple[Entry, PublishError]  # the entry a failure names, and the failure


@dataclass(eq=False)
class Pipeline:
    """The window of one ordered copier and its way to the target: a publisher per message, the
    batch writer for a backlog. `failures`, `stuck` and `backoff` are shared with the recovery:
    a landed copy ends a blocked target, an unknown failure and a backoff alike."""

    ep: Endpoints
    wake: asyncio.Event  # set by the PubAcks and the batches' frames
    transform: MessageTransform
    failures: FailureLog
    stuck: StuckWatch
    backoff: Backoff

    def __post_init__(self) -> None:
        ep = self.ep
        self.publisher = Publisher(ep.target_nc, wake=self.wake)
        self.writer = BatchWriter(ep.target_nc, self.wake, ep.worker)
        self.configured_in_flight = ep.profile.settings.max_in_flight
        self.window: deque[Entry] = deque()
        self.unsent: deque[Entry] = deque()  # the window's tail not yet published, in order
        self.committed = 0  # highest source sequence copied or skipped, in order
        self.ack_due: str | None = None  # reply subject of `committed` while not yet acked (AckAll)
        self.confirmed_target = 0  # target sequence of the newest confirmed copy (0: unknown)
        self.last_id: bytes | None = None  # Nats-Msg-Id of the last message published in the chain
        self.chain_open = False  # False: the next publish goes alone, without predecessor check
        self.avg_size = 0.0  # payload bytes per message, learned as messages arrive (0: none yet)

    async def start(self) -> None:
        await self.publisher.start()
        await self.writer.start()

    async def stop(self) -> None:
        await self.writer.stop()
        await self.publisher.stop()

    async def configure(self) -> None:
        """Read the target stream's features: how copies are built and written follows them."""
        self.transform.set_features(await self.writer.configure(self.ep))

    def rebase(self, committed: int, confirmed_target: int) -> None:
        """A new binding: the copy stands at `committed`, and its next publish goes alone."""
        self.committed, self.confirmed_target, self.chain_open = committed, confirmed_target, False

    def rebase_target(self, confirmed_target: int) -> None:
        """The target told where this writer's newest copy is (0: it could not tell)."""
        if confirmed_target:
            self.confirmed_target = confirmed_target

    # ---- sizes ----
    @property
    def max_in_flight(self) -> int:
        """The window: `max_in_flight`, times `BATCH_WINDOW` while writing batches, where messages
        in flight cost the target no acknowledgement each and long links need a deep window (not
        during a fan-in cool-down: a broken chain wastes the whole window)."""
        return self.configured_in_flight * (BATCH_WINDOW if self.writer.batching else 1)

    def capacity(self) -> int:
        """Messages the window holds at most, by count and by bytes."""
        return max(1, min(self.max_in_flight, int(MAX_BYTES_IN_FLIGHT / (self.avg_size or SIZE_GUESS))))

    @property
    def size(self) -> float:
        """Payload bytes per message, as learned (a guess until messages arrive)."""
        return self.avg_size or SIZE_GUESS

    def learn_size(self, seen: float) -> None:
        """Payload bytes per message of the deliveries admitted this turn."""
        self.avg_size = 0.8 * self.avg_size + 0.2 * seen if self.avg_size else seen

    # ---- placing ----
    @property
    def floor(self) -> int:
        """The highest source sequence the copier holds: committed, or in the window."""
        return max(self.committed, self.window[-1].last_seq) if self.window else self.committed

    def room(self, limit: int) -> int:
        """Copies a run may place now: one alone into an empty window while the chain is not open."""
        return 1 if not self.window and not self.chain_open else limit - len(self.window)

    @property
    def skips_waiting(self) -> bool:
        """Skipped deliveries wait for the last copy in the window (acknowledged with it)."""
        return bool(self.window and self.window[-1].skipped_seq)

    def place_run(self, entries: list[Entry]) -> Coroutine[Any, Any, None] | None:
        """A run's copies into the window, on their way to the target (`pump`); the coroutine that
        sends the first alone when it heads the window and the chain is not open."""
        self.window.extend(entries)
        self.unsent.extend(entries)
        if not self.chain_open and self.window[0] is entries[0]:
            return self.send_alone(entries[0])
        return None

    def place(self, msg: RawMsg, tokens: list[str], seq: int) -> Coroutine[Any, Any, None] | None:
        """One delivery's copy into the window (`place_run`)."""
        return self.place_run([copy_entry(msg, tokens, seq, self.transform, time.monotonic())])

    def skip(self, seq: int, reply: str) -> None:
        """A delivery not copied (sampled out, too old): done when the copy ahead of it is."""
        if self.window:
            self.window[-1].skipped_seq, self.window[-1].skipped_reply = seq, reply
        else:
            self.committed, self.ack_due = seq, reply

    # ---- sending ----
    async def pump(self) -> None:
        """Publish the unsent tail of the window, chained, in order: into a fast-ingest batch when
        the writer takes it (one is open, or the backlog is worth one), else one by one."""
        unsent, writer = self.unsent, self.writer
        near_limit = self.ep.target_nc._max_payload - 128  # the chain line and margin: checked per message
        while self.chain_open and unsent:
            if not unsent[0].copy.chainable:
                self.chain_open = False  # it goes alone once it heads the window; the rest wait for it
                break
            room = writer.room(len(unsent), self.capacity())
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
            sent_in(taken, *await writer.send(messages, self.capacity()))  # (batch, its first sequence)
            self.last_id = predecessor

    async def _publish(self, entry: Entry, predecessor: bytes | None) -> asyncio.Future[bytes]:
        copy = entry.copy
        entry.sent_at = time.monotonic()
        entry.attempts += 1
        return await self.publisher.publish(copy.subject, copy.payload, copy.block(predecessor))

    async def send_alone(self, entry: Entry) -> None:
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

    async def restart_chain(self) -> None:
        """With the chain not open, the head goes alone (unchained) when nothing of the window is
        on its way."""
        first = self.window[0] if self.window else None
        if not self.chain_open and first is not None and first.future is None and first.batch is None:
            await self.send_alone(first)

    # ---- retiring ----
    async def drain(self) -> Failed | None:
        """Retire the completed prefix of the window in order, then ack the source once (AckAll);
        the failure that stopped it, for the recovery (which drains again afterwards)."""
        ep = self.ep
        m = ep.metrics
        now = time.monotonic()
        copied = copied_bytes = 0
        received: list[float] = []
        failed: Failed | None = None
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
            self.count_copied(copied, copied_bytes)
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
            return failed
        if not self.chain_open and window and window[0].future is None and window[0].batch is None:
            await self.send_alone(window[0])  # a message that cannot be chained now heads the window
        elif last is not None and not self.writer.chained and self.unsent:
            await self.pump()  # unchained: a copy waiting for the one ahead of it to land can go now
        return None

    def count_copied(self, n: int, size: int) -> None:
        if n:
            self.ep.metrics.copied_msgs.inc(n)
            self.ep.metrics.copied_bytes.inc(size)

    # ---- what recovery and the clean stop use ----
    def in_flight(self) -> list[asyncio.Future[bytes]]:
        """The per-message publishes still waiting for their PubAck."""
        return [e.future for e in self.window if e.future is not None and not e.future.done()]

    def overdue(self, now: float) -> Entry | None:
        """The head, when its publish's ack never came (lost in a disconnect)."""
        head = self.window[0] if self.window else None
        if head is not None and head.future is not None and not head.future.done() and \
                now - head.sent_at > PUBLISH_TIMEOUT:
            return head
        return None

    async def abandon(self, err: PublishError) -> bool:
        """After a failure: stop waiting for anything sent; was any answer lost (it may have landed)?"""
        unsure = any_unsure(self.window)
        self.publisher.forget_all()
        self.writer.abandon(err)
        await self.writer.show(self.ep)
        return unsure

    def retire_landed(self, upto: int | None) -> None:
        """Retire the window's prefix that landed: up to source sequence `upto` (read from the
        target), else as the answers say (the chain makes what landed a prefix)."""
        window = self.window
        while window and ((upto is not None and window[0].seq <= upto) or landed(window[0])):
            done = window.popleft()
            settled(done.future)
            self.count_copied(1, len(done.msg.data))
            self.committed, self.ack_due = done.last_seq, done.last_reply

    def drop_head(self) -> Entry:
        """The head given up on (poison): done as if it had landed."""
        head = self.window.popleft()
        self.committed, self.ack_due = head.last_seq, head.last_reply
        return head

    def rebuild(self) -> None:
        """The target's features changed (TTL, roll-ups, counters): rebuild what is to be sent."""
        for e in self.window:
            e.copy = self.transform.build(e.msg, e.seq, e.ts)

    def reset(self) -> None:
        """Everything in the window is to be sent again, the first one alone."""
        self.unsent = reset(self.window)
        self.chain_open = False

    def forget(self) -> None:
        """The source stream was created again: what the window holds is another stream's."""
        self.publisher.forget_all()
        self.writer.abandon()
        self.reset()
        self.window.clear()
        self.unsent.clear()
        self.ack_due = None

    @property
    def batch_unconfirmed(self) -> bool:
        """The open batch holds messages not yet confirmed."""
        batch = self.writer.batch
        return batch is not None and not batch.ended and batch.unconfirmed > 0

