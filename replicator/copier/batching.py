"""Ordered mode's fast-ingest writes: a backlog goes to the target in fast-ingest batches
(`transport/fastbatch.py`), confirmed by the server's flow acks instead of one PubAck each.

**Which path.** A target stream with `allow_batched` (set by the replicator on streams it creates;
server 2.14+) gets batches; any other target keeps the per-message path, and so does one whose
server turns out not to speak fast ingest (10205 "disabled" or a plain PubAck for the first batch
message). The choice is logged, exported as `stream_replicator_write_path{path=...}` and noted in
the durable consumer's metadata for `report`.

**Exactly once and in order.** Every batch message still carries the chain
(`Nats-Expected-Last-Msg-Id` naming its predecessor), because a failure while storing does not
end a batch: only the chain keeps what landed a prefix. The source is acknowledged only up to what
a flow ack or the commit's PubAck confirmed (`state`). Any gap, error frame, plain error, timeout
or reconnect ends the batch for the copier, which recovers as on the per-message path: from the
answers when they tell it all (a chain break at message k: everything before k landed, nothing
after it), else from the target.

**Clustered targets.** On a stream in a JetStream cluster (R3, or R1 whose replicas may be raised
at any time), nothing is chained. From server 2.14 a replica that finds a
`Nats-Expected-Last-Msg-Id` mismatch while applying a message stops the stream for good ("critical
write error", until its servers restart), and in a cluster that check is made only there, after
the leader has proposed the message: another city's copy in between (fan-in), proposals lost in a
leader change, or a last id forgotten by a restart would each take the stream down. Order holds
without the chain: a batch's messages are proposed in batch order and a leader change that lost
some of them ends the batch with a gap (nothing after it is stored), while a message written per
message goes alone, once everything before it landed, so at most one is in flight. A backlog
therefore wants `allow_batched` on a clustered target.

**When.** A backlog of at least `BATCH_MIN` ready messages opens a batch; single messages of a
trickle go per message (no batch to open, no commit to wait for). An open batch takes every later
message while flow control allows (after the server's first flow ack, and at most the larger of
twice its cadence and the window unconfirmed); it is committed once nothing was sent to it for
`COMMIT_IDLE` while the source has nothing more pending or its deliveries are being skipped
(sampling: their acknowledgements wait for the batch's tail), for `COMMIT_WAIT` when more copies
are merely slow to come; the commit confirms the messages after the last flow boundary. The
flow asked for is a quarter of what the window holds, so acknowledgements come often enough to
keep the window moving when messages are large. After a chain break (another writer in between:
fan-in) the copier writes per message for `COOL_DOWN`, doubling while breaks recur: a broken chain
wastes the window in flight, and every abandoned batch counts against the stream's batch limit
for 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from enum import Enum

from nats.aio.client import Client
from nats.js.api import StreamInfo

from replicator.copier import durable
from replicator.copier.endpoints import PUBLISH_TIMEOUT, Endpoints
from replicator.copier.failures import Failure, classify
from replicator.copier.headers import TargetFeatures
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.fastbatch import BatchRouter, FastBatch
from replicator.transport.jetstream import PublishError
from replicator.transport.streams import set_consumer_note

log = logging.getLogger(__name__)

BATCH_MIN = 16  # ready messages that make a batch worth opening
COMMIT_IDLE = 0.02  # seconds without a message for the open batch before it is committed (caught up)
COMMIT_WAIT = 0.5  # the same while the source has more pending (a slow link, not the end of a backlog)
COOL_DOWN = 10.0  # seconds of per-message writes after a chain break in a batch: doubled while breaks
COOL_DOWN_MAX = 600.0  # recur (a busy fan-in), back to COOL_DOWN once a batch commits cleanly
OUTSTANDING = 2  # flow-ack intervals in flight (ADR-50 suggests 1 to 3)
BATCH_WINDOW = 8  # the ordered window on the batch path, in multiples of max_in_flight (4 held a 50 ms
# link's window full: 8,000 x 512 B took about 120 ms from send to flow ack)
RECHECK = 5.0  # seconds between reads of whether the target is clustered (then the chain ends)
FALLBACK_CODES = frozenset({10205, 10206, 10207})  # disabled, pattern or id refused: no fast ingest here
BATCH = "batch"
MESSAGE = "message"


def clustered(info: StreamInfo) -> bool:
    """The stream is replicated, or lives in a JetStream cluster, where its replicas can be raised
    at any time (a standalone server names no cluster)."""
    return (info.config.num_replicas or 1) > 1 or bool(info.cluster and info.cluster.name)


class State(Enum):
    PENDING = 0
    LANDED = 1
    FAILED = 2  # certainly not stored
    UNKNOWN = 3  # may or may not have been stored: only the target can tell


def state(batch: FastBatch, bseq: int) -> State:
    """Where batch message `bseq` stands, from the batch's frames."""
    if bseq <= batch.acked:
        return State.LANDED
    err = batch.error
    if err is None:
        return State.PENDING
    if classify(err) is Failure.CHAIN:  # the server refused it and, chained, everything after it
        return State.LANDED if bseq < batch.error_seq else State.FAILED
    if batch.error_seq == 1 and err.code and not batch.open:
        return State.FAILED  # message 1 refused outright; the rest waited for its flow ack
    return State.UNKNOWN


class BatchWriter:
    """The batch side of the ordered copier's writes to one target stream."""

    def __init__(self, nc: Client, wake: asyncio.Event, worker: str) -> None:
        self.nc = nc
        self.router = BatchRouter(nc, wake)
        self.worker = worker
        self.enabled = False  # the target stream allows batched publishing
        self.chained = True  # publishes carry the chain (not on a clustered target, see above)
        self.checked_at = 0.0  # when the target's configuration was last read
        self.batch: FastBatch | None = None
        self.cool_until = 0.0
        self.cool_for = COOL_DOWN
        self.last_send = 0.0
        self.last_ping = 0.0
        self.shown: tuple[str, bool] | None = None  # the path (and chaining) last logged, exported and noted

    @property
    def path(self) -> str:
        return BATCH if self.enabled else MESSAGE

    @property
    def batching(self) -> bool:
        """Batches may be written now: the target allows them and no fan-in cool-down is on."""
        return self.enabled and time.monotonic() >= self.cool_until

    async def start(self) -> None:
        await self.router.start()

    async def configure(self, ep: Endpoints) -> TargetFeatures:
        """The target stream's features, read now; how it is written follows them (and is shown)."""
        info = await ep.target_js.stream_info(ep.target_stream)
        features = TargetFeatures.of(info.config)
        self.enabled, self.chained = features.batched, not clustered(info)
        self.checked_at = time.monotonic()
        await self.show(ep)
        return features

    async def recheck(self, ep: Endpoints, now: float) -> None:
        """Every `RECHECK`: a standalone target restarted as part of a cluster must stop getting the
        chain before it breaks there (`clustered`). The path is left alone: a batch path turned off
        by the server's answers (`disable`) stays off until the next bind reads the stream."""
        if now - self.checked_at < RECHECK:
            return
        self.checked_at = now
        try:
            info = await ep.target_js.stream_info(ep.target_stream)
        except NATS_ERRORS:  # unreachable or gone: the copy's own failures tell of it
            return
        chained = not clustered(info)
        if chained != self.chained:
            self.chained = chained
            await self.show(ep)

    async def show(self, ep: Endpoints) -> None:
        """Log and export how the target is written (after every change), and note it on the
        durable for `report` when it changes at runtime (the durable is created with the note)."""
        path = self.path
        if (path, self.chained) == self.shown:
            return
        changed, self.shown = bool(self.shown), (path, self.chained)
        ep.metrics.write_path(path)
        if changed:
            with contextlib.suppress(Exception):
                await set_consumer_note(ep.source_js, ep.source_stream, ep.profile.durable_name, durable.WRITE_NOTE,
                                        path)
        if path == BATCH:
            log.info("%s writes to target stream %s in fast-ingest batches", ep.worker, ep.target_stream)
        else:
            log.info("%s writes to target stream %s per message (it does not allow batched publishing)",
                     ep.worker, ep.target_stream)
        if not self.chained:
            log.warning("%s target stream %s is in a JetStream cluster: its copies are not chained "
                        "(a Nats-Expected-Last-Msg-Id mismatch stops a clustered stream), so a message written per "
                        "message waits until the one before it landed%s", ep.worker, ep.target_stream,
                        "" if path == BATCH else "; allow_batched on the stream writes a backlog in batches")

    async def stop(self) -> None:
        await self.router.stop()

    def active(self) -> FastBatch | None:
        """The batch that takes new messages, if any."""
        b = self.batch
        if b is None or b.ended or b.committing:
            return None
        if b.legacy:
            self.disable("the server stored a batch message as a plain publish")
            return None
        return b

    def room(self, ready: int, window: int) -> int:
        """How many of `ready` messages the batch path takes now: -1 none (write them per message),
        0 not yet (flow control: the open batch waits for acknowledgements, at most the larger of
        `window` and twice the server's cadence unconfirmed)."""
        b = self.active()
        if b is None:
            if self.batch is not None and self.batch.error is not None:
                return 0  # a failed batch: nothing more goes out until recovery has dealt with it
            if not self.enabled or ready < BATCH_MIN or time.monotonic() < self.cool_until:
                return -1
            if self.batch is not None and not self.batch.ended:
                return -1  # not while the last one commits
            return 1  # a new batch: its first message alone, until the server's first flow ack
        if not b.sent:
            return 1
        if not b.open:
            return 0
        return max(0, max(OUTSTANDING * b.msgs, window) - b.unconfirmed)

    async def send(self, messages: list[tuple[str, bytes, bytes]], window: int) -> tuple[FastBatch, int]:
        """Into the open batch (opened here if none, asking for a flow of a quarter of the
        `window`): the batch and the batch sequence of the first message."""
        b = self.active()
        if b is None:
            b = self.batch = self.router.open(window // 4)
            log.debug("%s batch %s opened (flow %d)", self.worker, b.id, b.flow)
        self.last_send = time.monotonic()
        first = b.sent + 1
        try:
            await b.send(messages)
        except NATS_ERRORS as err:  # not written, or only partly: only the target can tell
            b.sent = first + len(messages) - 1
            b.fail(PublishError(f"batch publish failed: {type(err).__name__}: {err}"))
        return b, first

    async def tick(self, idle: bool, nothing_to_follow: bool = True) -> float:
        """Commit an idle batch, ping a quiet one, fail a silent or disconnected one; seconds until
        the next check is due. `idle`: nothing is waiting to be sent; `nothing_to_follow`: nothing
        more is coming to send soon either (the source is caught up, or its deliveries are skipped)."""
        b = self.batch
        if b is None or b.ended:
            if b is not None and b.error is None:
                self.cool_for = COOL_DOWN  # a batch went through: fan-in is over, or was brief
            return 1.0
        now = time.monotonic()
        if b.reconnects != self.nc.stats["reconnects"]:
            b.fail(PublishError("target connection lost during a batch"))
            return 1.0
        if b.unconfirmed or b.committing:
            quiet = now - b.progress
            if quiet > PUBLISH_TIMEOUT:
                b.fail(PublishError("batch publish timed out"))
                return 1.0
            if quiet > PUBLISH_TIMEOUT / 3 and now - self.last_ping > PUBLISH_TIMEOUT / 3 and not b.committing:
                self.last_ping = now
                with contextlib.suppress(Exception):
                    await b.ping()
        if b.committing or not b.sent:
            return 1.0
        due = self.last_send + (COMMIT_IDLE if nothing_to_follow else COMMIT_WAIT) - now
        if not idle or due > 0:
            return max(due, 0.001) if idle else 1.0
        try:
            log.debug("%s batch %s commits after %d messages (%d confirmed)", self.worker, b.id, b.sent, b.acked)
            await b.commit()
        except NATS_ERRORS as err:  # the commit not sent: the batch's messages are unconfirmed
            b.fail(PublishError(f"batch commit failed: {type(err).__name__}: {err}"))
        return 1.0

    async def commit_now(self) -> None:
        """At a clean stop: end the open batch, so the commit confirms its tail."""
        b = self.active()
        if b is not None and b.sent:
            with contextlib.suppress(Exception):
                await b.commit()

    def abandon(self, failure: PublishError | None = None) -> None:
        """After a failure (`failure`, the error recovery deals with): the batch is over for us (its
        later frames are ignored), and what it, or the failure, tells decides how the next messages go."""
        b = self.batch
        if failure is not None and self.path_failure(failure):
            self.disable(f"{failure.description} (code {failure.code})")
        if b is None:
            return
        self.router.forget(b)
        err = b.error
        if err is not None and (err.code in FALLBACK_CODES):
            self.disable(f"{err.description} (code {err.code})")
        elif err is not None and classify(err) is Failure.CHAIN:
            self.cool_until = time.monotonic() + self.cool_for
            log.info("%s another writer stored messages in between: writing per message for %.0f s",
                     self.worker, self.cool_for)
            self.cool_for = min(self.cool_for * 2, COOL_DOWN_MAX)
        self.batch = None

    def path_failure(self, err: PublishError) -> bool:
        """A failure of the batch path itself, not of the message (never counted toward poison)."""
        return err.code in FALLBACK_CODES

    def disable(self, why: str) -> None:
        if self.enabled:
            log.warning("%s target does not take fast-ingest batches (%s): writing per message", self.worker, why)
        self.enabled = False
