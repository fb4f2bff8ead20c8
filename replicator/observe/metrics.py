"""Prometheus metrics with the legacy tool's names (prefix `stream_replicator_`, labels `name`, `worker`).

Counters are Prometheus counters, so the exposition adds the conventional `_total` suffix to each
sample while the metric family keeps the legacy name. Each replicator owns a registry, so several
can run in one process (tests, the demo) without clashing.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

PREFIX = "stream_replicator_"
LABELS = ("name", "worker")

COUNTERS = {
    "received_msgs": "Messages received from the source",
    "received_bytes": "Payload bytes received from the source",
    "copied_msgs": "Messages copied to the target (acknowledged by it)",
    "copied_bytes": "Payload bytes copied to the target",
    "failed_msgs": "Publish attempts to the target that failed (retried; poison messages are skipped)",
    "acks_failed": "Acknowledgements to the source that could not be sent",
    "too_old_msgs": "Source messages older than max_age, acknowledged without copying",
    "poison_msgs": "Messages the target can never take, given up (dead-lettered or skipped; each logged once)",
    "dead_letter_msgs": "Poison messages published to the dead_letter subject",
    "loop_skipped_msgs": "Copies delivered back to the source that would loop, skipped (active_active)",
    "chain_restarts": "Ordered chain restarts because another writer stored a message in between (fan-in)",
    "connection_reconnections": "Reconnections of a NATS connection",
    "connection_closed": "NATS connections closed",
    "connection_errors": "NATS connection errors",
    "limiter_memory_skipped": "Messages the limiter skipped (sender copied within age)",
    "limiter_skipped_bytes": "Payload bytes of the messages the limiter skipped",
    "limiter_forced_msgs": "Messages whose update flag forced a copy",
    "consumer_recreated": "Times the source consumer was recreated while running (deleted, or deliveries lost)",
    "limiter_memory_passed": "Messages the limiter let through",
    "limiter_memory_errors": "Messages without a usable sampling key (copied anyway)",
    "limiter_state_errors": "Limiter state store operations that failed (copying continued, fail open)",
    "advisories_new": "Advisories sent: sender seen for the first time",
    "advisories_timeout": "Advisories sent: sender not seen for the advisory age",
    "advisories_recover": "Advisories sent: sender seen again after a timeout",
    "advisories_expire": "Advisories sent: sender not seen for the topic's age, forgotten",
    "advisories_blind_spot": "Advisories sent: a span in which the replicator was not watching (down or far behind)",
    "advisories_gap": "Advisories sent: a range the source stream discarded before it was copied",
    "advisories_errors": "Advisories that could not be published after all retries",
}

GAUGES = {
    "current_sequence": "Last source stream sequence copied or skipped by this worker",
    "lag_msgs": "Messages on the source consumer not yet copied (pending; plus unacknowledged while copies wait)",
    "limiter_memory_seen": "Senders the limiter currently tracks",
    "leader": "1 while this worker is the elected leader of its topic (or election is off), else 0",
    "target_blocked": "1 while the target refuses messages (e.g. stream full), else 0",
    "stuck": "1 while a message keeps failing with an error this release does not classify (after 60 s), else 0",
    "ready": "1 while the worker is ready (connected to both sides and bound, or a hot standby), else 0",
}

# The certificates a worker's connections present and trust, per side: extra labels `side`
# (source|target) and `certificate` (client: ours; ca: the first to expire in the CA bundle).
CERTIFICATE_LABELS = (*LABELS, "side", "certificate")
CERTIFICATE_GAUGES = {
    "certificate_expiry_timestamp_seconds": "notAfter of a certificate in use, unix seconds",
    "certificate_remaining_seconds": "Seconds until a certificate in use expires (negative once expired)",
}

HISTOGRAMS = {
    "processing_time": "Seconds from receiving a message to acknowledging it on the source",
}

# Gauges with one more label: 1 for the label value that holds now, 0 for the others.
STATES = {
    "write_path": ("path", ("batch", "message"),
                   "How this worker writes to the target: path=batch (fast-ingest batches) or path=message (1 = now)"),
}

# Source messages the source stream no longer held when the copy reached them, never copied: one
# more label `reason` (`copier/loss.py`): limits (max_msgs, max_bytes, max_age, per-subject limits),
# purge and delete (the server's API audit advisory named them).
LOSS_REASONS = ("limits", "purge", "delete")
LOSS = ("source_lost_msgs", "Source messages removed from the source stream before they were copied, by reason")

METRIC_NAMES = sorted(PREFIX + n for n in (*COUNTERS, *GAUGES, *CERTIFICATE_GAUGES, *HISTOGRAMS, *STATES, LOSS[0]))

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The metric families of one replicator process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.counters = {n: Counter(PREFIX + n, h, LABELS, registry=self.registry) for n, h in COUNTERS.items()}
        self.gauges = {n: Gauge(PREFIX + n, h, LABELS, registry=self.registry) for n, h in GAUGES.items()}
        self.certificate_gauges = {
            n: Gauge(PREFIX + n, h, CERTIFICATE_LABELS, registry=self.registry) for n, h in CERTIFICATE_GAUGES.items()
        }
        self.histograms = {
            n: Histogram(PREFIX + n, h, LABELS, registry=self.registry, buckets=_BUCKETS)
            for n, h in HISTOGRAMS.items()
        }
        self.states = {n: Gauge(PREFIX + n, h, (*LABELS, label), registry=self.registry)
                       for n, (label, _values, h) in STATES.items()}
        self.source_lost = Counter(PREFIX + LOSS[0], LOSS[1], (*LABELS, "reason"), registry=self.registry)
        # A reloading process's own families, registered at its first reload.
        self.reloads: Counter | None = None
        self.last_reload_ok: Gauge | None = None

    def reloaded(self, ok: bool) -> None:
        """A config reload (`replicate --reload`) that applied (`ok`), or that failed to load."""
        if self.reloads is None:
            self.reloads = Counter(PREFIX + "config_reloads", "Config file reloads, by result (ok: applied; "
                                   "error: the file did not load and the previous configuration runs on)",
                                   ("result",), registry=self.registry)
            self.last_reload_ok = Gauge(PREFIX + "config_last_reload_successful",
                                        "1 if the last config reload applied, 0 if it failed", registry=self.registry)
        self.reloads.labels(result="ok" if ok else "error").inc()
        assert self.last_reload_ok is not None
        self.last_reload_ok.set(1 if ok else 0)

    def worker(self, name: str, worker: str) -> WorkerMetrics:
        return WorkerMetrics(self, name, worker)

    def forget(self, name: str, worker: str) -> None:
        """Drop a worker's series, as when a reload removes its replication: scrapes stop showing
        it, rather than its last values for ever."""
        removals: list[tuple[MetricWrapperBase, tuple[str, ...]]] = [
            (family, (name, worker))
            for family in (*self.counters.values(), *self.gauges.values(), *self.histograms.values())]
        removals += [(family, (name, worker, side, role)) for family in self.certificate_gauges.values()
                     for side in ("source", "target") for role in ("client", "ca")]
        removals += [(self.states[n], (name, worker, value)) for n, (_label, values, _h) in STATES.items()
                     for value in values]
        removals += [(self.source_lost, (name, worker, reason)) for reason in LOSS_REASONS]
        for family, labels in removals:
            with contextlib.suppress(KeyError):
                family.remove(*labels)


@dataclass
class WorkerMetrics:
    """Metrics bound to one worker's labels, so hot paths skip the label lookup."""

    metrics: Metrics
    name: str
    worker: str

    def __post_init__(self) -> None:
        labels = {"name": self.name, "worker": self.worker}
        m = self.metrics
        c = {n: f.labels(**labels) for n, f in m.counters.items()}
        g = {n: f.labels(**labels) for n, f in m.gauges.items()}
        self.received_msgs = c["received_msgs"]
        self.received_bytes = c["received_bytes"]
        self.copied_msgs = c["copied_msgs"]
        self.copied_bytes = c["copied_bytes"]
        self.failed_msgs = c["failed_msgs"]
        self.acks_failed = c["acks_failed"]
        self.too_old_msgs = c["too_old_msgs"]
        self.poison_msgs = c["poison_msgs"]
        self.dead_letter_msgs = c["dead_letter_msgs"]
        self.chain_restarts = c["chain_restarts"]
        self.loop_skipped_msgs = c["loop_skipped_msgs"]
        self.reconnections = c["connection_reconnections"]
        self.closed = c["connection_closed"]
        self.errors = c["connection_errors"]
        self.limiter_skipped = c["limiter_memory_skipped"]
        self.limiter_skipped_bytes = c["limiter_skipped_bytes"]
        self.limiter_forced = c["limiter_forced_msgs"]
        self.consumer_recreated = c["consumer_recreated"]
        self.limiter_passed = c["limiter_memory_passed"]
        self.limiter_errors = c["limiter_memory_errors"]
        self.limiter_state_errors = c["limiter_state_errors"]
        self.advisories = {e: c[f"advisories_{e}"] for e in ("new", "timeout", "recover", "expire")}
        self.advisories_errors = c["advisories_errors"]
        self.advisories_gap = c["advisories_gap"]
        self.advisories_blind_spot = c["advisories_blind_spot"]
        self.current_sequence = g["current_sequence"]
        self.lag_msgs = g["lag_msgs"]
        self.limiter_seen = g["limiter_memory_seen"]
        self.leader = g["leader"]
        self.target_blocked = g["target_blocked"]
        self.stuck = g["stuck"]
        self.ready = g["ready"]
        self.processing_time = m.histograms["processing_time"].labels(**labels)
        self.source_lost = {r: m.source_lost.labels(reason=r, **labels) for r in LOSS_REASONS}

    def certificate(self, side: str, role: str, not_after: Callable[[], float]) -> None:
        """Export a certificate's expiry, read from `not_after` at every scrape (it follows reloads)."""
        gauges = self.metrics.certificate_gauges
        labels = {"name": self.name, "worker": self.worker, "side": side, "certificate": role}
        gauges["certificate_expiry_timestamp_seconds"].labels(**labels).set_function(not_after)
        gauges["certificate_remaining_seconds"].labels(**labels).set_function(lambda: not_after() - time.time())

    def write_path(self, path: str) -> None:
        """`batch` or `message` (see `copier/batching.py`)."""
        self._state("write_path", path)

    def _state(self, name: str, value: str) -> None:
        label, values, _help = STATES[name]
        family = self.metrics.states[name]
        for v in values:
            family.labels(name=self.name, worker=self.worker, **{label: v}).set(1 if v == value else 0)


def observe_many(histogram: Histogram, amounts: Iterable[float]) -> None:
    """`histogram.observe` for many values at once: the same counts and sum, with one locked update
    per bucket touched instead of two per value (the copy loops observe every message)."""
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
    except AttributeError:  # another prometheus_client layout: one by one
        for amount in amounts:
            histogram.observe(amount)
        return
    counts: dict[int, int] = {}
    summed = 0.0
    where = bisect.bisect_left
    for amount in amounts:
        summed += amount
        i = where(bounds, amount)
        counts[i] = counts.get(i, 0) + 1
    if counts:
        total.inc(summed)
        for i, n in counts.items():
            buckets[i].inc(n)
