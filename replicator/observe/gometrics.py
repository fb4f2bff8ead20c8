"""The Go Stream Replicator's metrics (`choria_stream_replicator_*`, with its labels), served beside ours.

Its users' Grafana dashboard (grafana.com 15928) and alerts query these names, so a Go-format
config gets them unchanged. They are a view: at scrape time the replicator families are read from
our own registry (nothing extra on the hot path) and relabelled `stream`, `replicator`, `worker`;
elections, advisors and heartbeats add theirs through `add_source`. prometheus_client always
appends `_total` to a counter's samples while the Go client does not, so this view writes its own
text exposition, appended to ours on `/metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

NAMESPACE = "choria_stream_replicator_"
STREAM_LABELS = ("stream", "replicator", "worker")
LIMITER_LABELS = ("limiter", "stream", "replicator")
ADVISOR_LABELS = ("advisory", "stream", "replicator")

# family -> (type, help, labels); the Go tool's names and help texts.
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "replicator_total_messages": ("counter", "The total number of messages processed including ones that would be "
                                             "ignored", STREAM_LABELS),
    "replicator_total_bytes": ("counter", "The size of messages processed including ones that would be ignored",
                               STREAM_LABELS),
    "replicator_handler_error_count": ("counter", "The number of times the handler failed to process a message",
                                       STREAM_LABELS),
    "replicator_processing_time_seconds": ("summary", "How long it took to process messages", STREAM_LABELS),
    "replicator_stream_sequence": ("gauge", "The stream sequence of the last message received from the consumer",
                                   STREAM_LABELS),
    "replicator_stream_lag_messages": ("gauge", "Messages pending on the source consumer", STREAM_LABELS),
    "replicator_too_old_messages": ("counter", "How many messages were discarded for being too old", STREAM_LABELS),
    "replicator_copied_messages": ("counter", "How many messages were copied", STREAM_LABELS),
    "replicator_copied_bytes": ("counter", "The size of messages that were copied", STREAM_LABELS),
    "replicator_skipped_messages": ("counter", "How many messages were skipped due to limiter configuration",
                                    STREAM_LABELS),
    "replicator_skipped_bytes": ("counter", "The size of messages that were skipped due to limited configuration",
                                 STREAM_LABELS),
    "replicator_meta_parse_failed_count": ("counter", "How many times a message metadata could not be parsed",
                                           STREAM_LABELS),
    "replicator_ack_failed_count": ("counter", "How many times an ack or nack failed", STREAM_LABELS),
    "replicator_consumer_recreated": ("counter", "How many times the source consumer had to be recreated",
                                      STREAM_LABELS),
    "tracker_total_items": ("gauge", "Number of entries being tracked", STREAM_LABELS),
    "tracker_seen_by_gossip": ("gauge", "Number of entries that we learned about via gossip synchronization",
                               STREAM_LABELS),
    "limiter_messages_without_limit_field_count": ("counter", "The number of messages that did not have the data "
                                                              "field or header used for limiting", LIMITER_LABELS),
    "limiter_messages_copy_forced_count": ("counter", "The number of messages that were copied due to matching on "
                                                      "the force copy value", LIMITER_LABELS),
    "advisor_total_messages": ("counter", "The total number of advisories sent", ADVISOR_LABELS),
    "advisor_publish_errors": ("counter", "The number of times publishing advisories failed", ADVISOR_LABELS),
    "election_campaigns": ("counter", "The number of campaigns a specific candidate voted in",
                           ("election", "identity", "state", "replicator")),
    "election_leader": ("gauge", "Indicates if a specific instance is the current leader",
                        ("election", "identity", "replicator")),
    "election_interval_seconds": ("gauge", "The number of seconds between campaigns",
                                  ("election", "identity", "replicator")),
    "heartbeat_subjects_count": ("gauge", "Number of subjects that heartbeats are being published for",
                                 ("replicator",)),
    "heartbeat_published_count": ("counter", "Number of published messages", ("replicator", "subject")),
    "heartbeat_published_error_count": ("counter", "Number of published message errors", ("replicator", "subject")),
    "heartbeat_publish_time": ("summary", "Time taken to publish a message", ("replicator", "subject")),
    "heartbeat_paused": ("gauge", "Paused under leader election", ("replicator", "hostname")),
}

# Our sample -> the Go family it feeds, for the families read from our registry.
_STREAM_MIRROR = {
    "stream_replicator_received_msgs_total": "replicator_total_messages",
    "stream_replicator_received_bytes_total": "replicator_total_bytes",
    "stream_replicator_failed_msgs_total": "replicator_handler_error_count",
    "stream_replicator_too_old_msgs_total": "replicator_too_old_messages",
    "stream_replicator_copied_msgs_total": "replicator_copied_messages",
    "stream_replicator_copied_bytes_total": "replicator_copied_bytes",
    "stream_replicator_limiter_memory_skipped_total": "replicator_skipped_messages",
    "stream_replicator_limiter_skipped_bytes_total": "replicator_skipped_bytes",
    "stream_replicator_acks_failed_total": "replicator_ack_failed_count",
    "stream_replicator_consumer_recreated_total": "replicator_consumer_recreated",
    "stream_replicator_processing_time_sum": "replicator_processing_time_seconds_sum",
    "stream_replicator_processing_time_count": "replicator_processing_time_seconds_count",
    "stream_replicator_current_sequence": "replicator_stream_sequence",
    "stream_replicator_lag_msgs": "replicator_stream_lag_messages",
    "stream_replicator_limiter_memory_seen": "tracker_total_items",
}
_LIMITER_MIRROR = {
    "stream_replicator_limiter_memory_errors_total": "limiter_messages_without_limit_field_count",
    "stream_replicator_limiter_forced_msgs_total": "limiter_messages_copy_forced_count",
}
_GAUGES_BY_MAX = {"replicator_stream_sequence", "replicator_stream_lag_messages", "tracker_total_items"}
_ALWAYS_ZERO = ("replicator_meta_parse_failed_count", "tracker_seen_by_gossip")  # no such failure, no gossip here

Sample = tuple[str, dict[str, str], float]
"""(sample name without the namespace, e.g. `heartbeat_publish_time_sum`, labels, value)."""


@dataclass(frozen=True)
class GoStream:
    """How one of our profiles is labelled the Go tool's way."""

    stream: str
    replicator: str
    worker: str
    consumer: str


class GoMetrics:
    """The Go tool's metric families over one process's registry, plus registered sources."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.streams: dict[str, GoStream] = {}  # our `name` label -> its Go labels
        self._sources: list[Callable[[], Iterable[Sample]]] = []

    def add_stream(self, name: str, stream: GoStream) -> None:
        self.streams[name] = stream

    def add_source(self, source: Callable[[], Iterable[Sample]]) -> None:
        self._sources.append(source)

    def samples(self) -> list[Sample]:
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

        def put(sample: str, labels: dict[str, str], value: float, *, by_max: bool = False) -> None:
            key = (sample, tuple(labels.items()))
            out[key] = max(out.get(key, value), value) if by_max else out.get(key, 0.0) + value

        for labelled in self.streams.values():
            for family in _ALWAYS_ZERO:
                put(family, _stream_labels(labelled), 0.0)
        for metric in self.registry.collect():
            for s in metric.samples:
                go = self.streams.get(s.labels.get("name", ""))
                if go is None:
                    continue
                if s.name in _STREAM_MIRROR:
                    family = _STREAM_MIRROR[s.name]
                    put(family, _stream_labels(go), s.value, by_max=family in _GAUGES_BY_MAX)
                elif s.name in _LIMITER_MIRROR:
                    put(_LIMITER_MIRROR[s.name], {"limiter": "memory", "stream": go.consumer,
                                                  "replicator": go.replicator}, s.value)
                elif s.name.startswith("stream_replicator_advisories_") and s.name.endswith("_total"):
                    event = s.name.removeprefix("stream_replicator_advisories_").removesuffix("_total")
                    if event in ("new", "timeout", "recover", "expire"):
                        put("advisor_total_messages", {"advisory": event, "stream": go.stream,
                                                       "replicator": go.replicator}, s.value)
        for source in self._sources:
            for sample, labels, value in source():
                put(sample, labels, value)
        return [(sample, dict(labels), value) for (sample, labels), value in out.items()]

    def render(self) -> bytes:
        """The Prometheus text exposition of every family that has samples, as the Go client writes it."""
        by_family: dict[str, list[Sample]] = {}
        for item in self.samples():
            by_family.setdefault(_family_of(item[0]), []).append(item)
        lines: list[str] = []
        for family in sorted(by_family):
            kind, help_text, names = FAMILIES[family]
            lines.append(f"# HELP {NAMESPACE}{family} {help_text}")
            lines.append(f"# TYPE {NAMESPACE}{family} {kind}")
            for sample, labels, value in sorted(by_family[family], key=lambda s: (s[0], sorted(s[1].items()))):
                text = ",".join(f'{k}="{_escape(labels[k])}"' for k in names if k in labels)
                lines.append(f"{NAMESPACE}{sample}{{{text}}} {floatToGoString(value)}")
        return ("\n".join(lines) + "\n").encode() if lines else b""


def _stream_labels(go: GoStream) -> dict[str, str]:
    return {"stream": go.stream, "replicator": go.replicator, "worker": go.worker}


def _family_of(sample: str) -> str:
    if sample in FAMILIES:
        return sample
    for suffix in ("_sum", "_count"):
        base = sample.removesuffix(suffix)
        if base != sample and FAMILIES.get(base, ("",))[0] == "summary":
            return base
    raise KeyError(f"{sample} is not a sample of a Go-format family")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
