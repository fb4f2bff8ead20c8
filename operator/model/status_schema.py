"""The status subresource as typed models: its schema in the CRD, and what `kubectl explain
streamreplication.status` shows. model/status.py computes the values the operator writes there."""

from __future__ import annotations

from typing import Literal

from replication_operator.model.fields import Model, field


class Condition(Model):
    """A metav1.Condition."""

    type: str = field("Condition type: Ready, Progressing, Degraded, Reconciling, Stalled, Engine, "
                      "CertificatesExpiring, SourceRecreated or Paused.",
                      maxLength=316, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                                             r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")
    status: Literal["True", "False", "Unknown"] = field("Whether the condition holds.")
    observed_generation: int | None = field("The spec generation the condition was set for.", None,
                                            format="int64", minimum=0)
    last_transition_time: str = field("When the condition's status last changed.", format="date-time")
    reason: str = field("Why, in one CamelCase word (docs/operator.md lists them).",
                        minLength=1, maxLength=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = field("What the operator saw, for people.", maxLength=32768)


class NativeStart(Model):
    sequence: int | None = field("Source sequence the entry starts at.", None, format="int64")
    time: str | None = field("Time the entry starts at.", None, format="date-time")


class NativeEntry(Model):
    stream: str | None = field("Target stream carrying the entry.", None)
    source_stream: str | None = field("Source stream the entry reads.", None)
    api_prefix: str | None = field("JetStream API prefix the entry reads the source through.", None)
    filter_subjects: list[str] | None = field("Subjects of the source the entry copies.", None)
    destinations: list[str] | None = field("Subject transform destinations (`>` when subjects are kept).", None)
    start: NativeStart | None = field("Where the entry starts when NATS has no position of its own for it.", None)
    form: Literal["source", "mirror"] | None = field(
        "`mirror`: the target stream is a mirror of the source; `source` (or absent): a source entry on it.", None)
    form_reason: str | None = field("Why this form runs.", None)
    source_created: str | None = field("When the source stream the entry reads was created (a new one: repaired).",
                                       None)
    recreations: int | None = field("How often the source stream was found created again and the entry reset.",
                                    None, format="int64")
    last_recreation: str | None = field("What the operator found and did the last time.", None)


class Fleet(Model):
    nodes: int | None = field("Nodes in the last fleet-health summary.", None, format="int64")
    healthy: int | None = field("Nodes whose last advisory was `new` or `recover`.", None, format="int64")
    timeout: int | None = field("Nodes whose last advisory was `timeout` (gone quiet).", None, format="int64")
    expired: int | None = field("Nodes whose last advisory was `expire` (retired).", None, format="int64")
    unknown: int | None = field("Nodes whose timeout was judged inside a blind spot of their replicator (not "
                                "watching): neither healthy nor timed out.", None, format="int64")
    availability: float | None = field("healthy / (healthy + timeout); absent when no node reports.", None)
    last_run: str | None = field("When the fleet-health job last ran.", None, format="date-time")


class SourceLoss(Model):
    lost: int | None = field("Source messages removed from the source stream before they were copied, in all.", None,
                             format="int64")
    by_reason: dict[str, int] | None = field("The same, by reason: limits, purge, delete.", None)
    first: int | None = field("First source sequence of the latest range lost.", None, format="int64")
    last: int | None = field("Last source sequence of the latest range lost.", None, format="int64")
    at: str | None = field("When the latest range was found.", None, format="date-time")


class StreamReplicationStatus(Model):
    """What the operator observed."""

    observed_generation: int | None = field("The spec generation the status was computed for.", None,
                                            format="int64", minimum=0)
    conditions: list[Condition] | None = field(
        "Ready, Progressing and Degraded; Reconciling and Stalled (kstatus: Flux); Engine (which engine runs, "
        "and why); CertificatesExpiring when TLS Secrets are mounted; Paused while paused by annotation.", None,
        **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    replicas: int | None = field("Worker pods that exist (the scale subresource's status replicas).", None,
                                 format="int32")
    ready_replicas: int | None = field("Worker pods that are ready.", None, format="int32")
    selector: str | None = field("Label selector of the worker pods (the scale subresource's, for an HPA).", None)
    lag: int | None = field(
        "Messages not yet copied: the replicator consumer's pending count, or NATS's lag for the native engine's "
        "source entry.", None, format="int64")
    last_active: str | None = field(
        "Last time the replicator's consumer acknowledged a message, or NATS last saw the native engine's source.",
        None, format="date-time")
    consumer: str | None = field(
        "The replicator's durable consumer on the source stream, as last read; a durable left by a change of mode, "
        "name or engine is deleted once no pod can use it.", None)
    engine: Literal["native", "replicator"] | None = field(
        "The engine in charge; the Engine condition says why it was chosen.", None)
    resume_after: int | None = field(
        "The last source sequence the native engine delivered before the replicator took over: the replicator "
        "starts after it.", None, format="int64")
    native: NativeEntry | None = field("The native engine's source entry, as the operator wrote it.", None)
    fleet: Fleet | None = field("Fleet totals from the fleet-health job's summary.", None)
    source_loss: SourceLoss | None = field(
        "What the source stream removed before the replicator copied it (its limits, a purge, a delete), as the "
        "workers noted it on their durable consumer; absent while nothing was lost.", None)
