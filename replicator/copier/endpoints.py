"""What a copy loop is given (connections, streams, names, the limiter) and the per-message
decisions every loop shares: first-start position, max_age and sampling verdicts, batched counts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nats.aio.client import Client
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext

from replicator.config.model import Profile
from replicator.copier.provenance import stream_identity
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.clock import StreamClock
from replicator.sampling.limiter import Pending, copy_everything
from replicator.transport.streams import stream_created
from replicator.transport.wire import ACK_TIMESTAMP, RawMsg

PUBLISH_TIMEOUT = 5.0
ACK_WAIT = 30.0
POISON_ATTEMPTS = 5


Verdict = Callable[[RawMsg, list[str], int], "bool | Pending"]


class Decider(Protocol):
    """The limiter as the copy loops see it: the check from `for_deliveries` decides at once when it
    can (a skip, at fleet rates, costs no await), else returns what `settle` needs to decide with
    the shared store; `flush` publishes its counts, once per batch."""

    def for_deliveries(self) -> Verdict: ...
    def claim_ahead(self, deliveries: deque[RawMsg], most: int, oldest_ns: int = 0) -> None: ...
    async def settle(self, pending: Pending) -> bool: ...
    def flush(self) -> None: ...


def verdict_for(ep: Endpoints, looped: Callable[[RawMsg, int], bool] | None = None) -> Verdict:
    """Copy this delivery? Not when it would loop (`looped`: `loops.LoopGuard`, which skips or refuses by raising),
    older than `max_age` (counted) or sampled out; `Pending` when only `settle` can tell.
    Synchronous, because at fleet rates most answers need no waiting; bound to one loop's settings
    once, because it runs for every delivery."""
    decide = _verdict_for(ep)
    if looped is None:
        return decide

    def guarded(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        if msg.hdr is not None and looped(msg, seq):
            return False
        return decide(msg, tokens, seq)

    return guarded


def copies_the_rest(ep: Endpoints) -> bool:
    """Does `verdict_for` copy every delivery that carries no provenance header (no max_age, no
    sampling)? Then `admission.take_run` asks it only about the ones that do."""
    return not ep.profile.settings.max_age and ep.limiter is None


def _verdict_for(ep: Endpoints) -> Verdict:
    max_age = ep.profile.settings.max_age
    sampled = ep.limiter.for_deliveries() if ep.limiter is not None else None
    if not max_age:
        return sampled or copy_everything

    oldest = float(max_age)

    def verdict(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        if time.time() - int(tokens[ACK_TIMESTAMP]) / 1e9 > oldest:
            ep.metrics.too_old_msgs.inc()
            return False
        return True if sampled is None else sampled(msg, tokens, seq)

    return verdict


class GapPublisher(Protocol):
    """The advisor as a copy loop's `gap` advisories use it (`loss.py`): its replicator name, and
    its publish (the advisory subject, retries)."""

    replicator: str

    async def publish(self, advisory: dict[str, Any]) -> bool: ...


CLAIM_AHEAD = 512  # deliveries whose sampling claims start while the copy loop waits for one (KV state)


async def settle(ep: Endpoints, pending: Pending, behind: deque[RawMsg] | None = None) -> bool:
    """The store's decision on `pending`; the claims of the deliveries `behind` it start first,
    so that they travel to the KV together (`Limiter.claim_ahead`)."""
    assert ep.limiter is not None
    if behind:
        # Not the deliveries near `max_age`: one that turns too old before its turn would have
        # claimed its sender for nothing. They are claimed in their turn, if still young enough.
        max_age = ep.profile.settings.max_age
        young = max_age - min(10.0, max_age / 2) if max_age else 0.0
        ep.limiter.claim_ahead(behind, CLAIM_AHEAD, int((time.time() - young) * 1e9) if max_age else 0)
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
    advisor: GapPublisher | None = None  # publishes `gap` advisories (`loss.py`), when they are on
    clock: StreamClock | None = None  # told the time of the messages handled (`sampling/clock.py`)
    # Metadata the loop's durable carries whenever it is (re)created (`durable.place`): the loss so far.
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def source_js(self) -> JetStreamContext:
        """The source's JetStream API, through `api_prefix` (a JetStream domain, `$JS.<domain>.API`,
        or an API imported from another account), as the puller and `source_identity` reach it."""
        return self.source_nc.jetstream(prefix=self.api_prefix)

    @property
    def target_js(self) -> JetStreamContext:
        return self.target_nc.jetstream()


async def source_identity(ep: Endpoints) -> str:
    """The source stream instance now: it changes when the stream is deleted and created again,
    and with it the writer id its copies carry."""
    return stream_identity(await stream_created(ep.source_nc, ep.source_stream, ep.api_prefix))


def start_position(profile: Profile) -> dict[str, object]:
    """Consumer settings for the very first start (never applied when resuming). `resume_after`
    wins: what another engine copied already is never copied again."""
    s = profile.settings
    if s.resume_after:
        return {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": s.resume_after + 1}
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


def flush_counts(ep: Endpoints, lag: str | None) -> None:
    """Per-batch metrics (a locked update per message would cost more than a skipped message)."""
    if lag is not None:
        ep.metrics.lag_msgs.set(int(lag))
    if ep.limiter is not None:
        ep.limiter.flush()
