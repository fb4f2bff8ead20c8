"""A StreamReplication's spec as typed models: the one definition the CRD's schema is generated from
(model/crd.py), the operator reads every resource through (`parse_spec`), and the builders use.

The API server applies the CRD's defaults, but objects written before a default existed (and the
test emulator) may lack them: the models carry the same defaults, so both read alike. Field
descriptions are what `kubectl explain streamreplication.spec...` shows; model/fields.py says which
rules the models check themselves and which only the API server does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from replication_operator.model import naming
from replication_operator.model.connection_fields import (
    CONNECTION_RULES,
    ONE_WAY_RULES,
    URL_DESCRIPTION,
    Connection,
    ConnectionRef,
)
from replication_operator.model.fields import (
    DURATION,
    JETSTREAM_NAME,
    LITERAL_SUBJECT,
    NATS_URLS,
    Model,
    duration_field,
    field,
    name_field,
)
from replication_operator.model.fleet_health import FleetHealth
from replication_operator.model.native import NativeSettings
from replication_operator.model.network import NetworkPolicySettings
from replication_operator.model.pods import Monitoring, Resources, Toleration
from replication_operator.model.pool import POOL_DESCRIPTION, POOL_NAME, POOL_NAME_MAX, POOL_RULES, pool_problems
from replication_operator.model.template import WorkerTemplate

TLS_CA = "ca.crt"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

Side = Literal["source", "target"]
Engine = Literal["auto", "native", "replicator"]


class SpecError(ValueError):
    """The spec cannot be turned into a worker config (the CRD schema normally prevents it)."""


def _url_or_reference(schema: dict[str, Any]) -> None:
    """A side's url in the CRD: the pattern, and no default (a connectionRef stands in for it)."""
    schema.pop("default", None)
    schema.update(maxLength=2048, pattern=NATS_URLS)


class Endpoint(Connection):
    """One side of the replication: NATS URL, stream and the Secrets to reach it, written here or held by
    a NatsConnection that `connectionRef` names (the reconciler lays its fields in before use)."""

    side: ClassVar[Side]

    url: str = Field("", description=URL_DESCRIPTION + " Excludes connectionRef.",
                     json_schema_extra=_url_or_reference)
    connection_ref: ConnectionRef | None = field(
        "A NatsConnection in this namespace holding the URL, TLS and credentials Secrets of this side, shared by "
        "many StreamReplications; excludes url and the Secret, TLS and CA fields here.", None)

    def inline(self) -> list[str]:
        """The connection fields written here (what a connectionRef excludes)."""
        return [f"{self.where}.{info.alias or name}" for name, info in Connection.model_fields.items()
                if getattr(self, name)]

    @model_validator(mode="after")
    def _inline_or_shared(self) -> Endpoint:
        if self.connection_ref is None and not self.url:
            raise ValueError(f"{self.where}.url is required (or {self.where}.connectionRef, a NatsConnection)")
        if self.connection_ref is not None and self.inline():
            raise ValueError(f"{self.where}.connectionRef and {', '.join(self.inline())} exclude each other: the "
                             f"NatsConnection \"{self.connection_ref.name}\" holds the {self.side}'s URL, TLS and "
                             "credentials")
        return self


class Source(Endpoint):
    """How the replicator reads the source, and how the *target* reaches the source's JetStream API (the
    native engine): a JetStream domain, or an API prefix imported into the target's account."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "!(has(self.domain) && has(self.apiPrefix))", "message": "source takes domain or apiPrefix, not both"},
        {"rule": "!has(self.deliverPrefix) || has(self.apiPrefix)",
         "message": "source.deliverPrefix needs source.apiPrefix"},
        *ONE_WAY_RULES, *CONNECTION_RULES]}}
    side: ClassVar[Side] = "source"

    stream: str | None = field("Source JetStream stream; found by the topic when absent.", None,
                               maxLength=255, pattern=JETSTREAM_NAME)
    domain: str | None = field(
        "JetStream domain of the source, as the target's servers reach it (a leafnode or gateway in the same "
        "account): the native engine reads it through `$JS.<domain>.API`.", None,
        maxLength=64, pattern=r"^[A-Za-z0-9_-]+$")
    api_prefix: str | None = field(
        "JetStream API prefix imported into the target's account from the source's (another account): the native "
        "engine reads the source through it.", None, maxLength=255, pattern=LITERAL_SUBJECT)
    deliver_prefix: str | None = field("Deliver prefix imported with apiPrefix (another account).", None,
                                       maxLength=255, pattern=LITERAL_SUBJECT)

    @model_validator(mode="after")
    def _one_route(self) -> Source:
        if self.domain and self.api_prefix:
            raise ValueError("spec.source takes domain or apiPrefix, not both")
        if self.deliver_prefix and not self.api_prefix:
            raise ValueError("spec.source.deliverPrefix needs spec.source.apiPrefix")
        return self


class Target(Endpoint):
    """The cluster and stream the copies go to, and how a missing stream is created."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": [*ONE_WAY_RULES, *CONNECTION_RULES]}}
    side: ClassVar[Side] = "target"

    stream: str | None = field("Target JetStream stream; defaults to the source stream's name.", None,
                               maxLength=255, pattern=JETSTREAM_NAME)
    subject_prefix: str | None = field("Prefix added to every subject on the target.", None,
                                       maxLength=255, pattern=LITERAL_SUBJECT)
    subject_remove: str | None = field("Text removed from every subject on the target (after the prefix).", None,
                                       minLength=1, maxLength=255, pattern=r"^\S+$")
    create: bool = field("Create the target stream when it is missing.", True)
    replicas: int | None = field(
        "Replicas of a target stream the replicator creates (default: the source stream's; one on a target "
        "server that is not clustered). An existing stream is never changed.", None, minimum=1, maximum=5)

    max_msgs: int | None = field(
        "Message limit of a target stream the replicator creates (default none: a source's limits were sized for one "
        "source, and a target is often shared by many). An existing stream is never changed.", None, minimum=1)
    max_bytes: int | None = field("Byte limit of a target stream the replicator creates (default none).", None,
                                  minimum=1)
    max_age: str | None = duration_field("Age limit of a target stream the replicator creates (default the "
                                         "source's max_age; `0s`: none).")
    max_msgs_per_subject: int | None = field(
        "Per-subject message limit of a target stream the replicator creates (default none).", None, minimum=1)
    discard: Literal["old", "new"] | None = field(
        "What a target stream the replicator creates does at a limit: `old` (default) drops its oldest, `new` "
        "refuses copies (they wait on the source).", None)

    @field_validator("replicas", mode="before")
    @classmethod
    def _stream_replicas(cls, value: Any) -> Any:
        """What NATS allows a stream (1 to 5); a string or a boolean is not a number of replicas."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5):
            raise ValueError(f"spec.target.replicas must be 1 to 5, not {value!r}")
        return value


class Start(Model):
    """Where a new consumer starts: exactly one of the four."""

    model_config = {"json_schema_extra": {
        "x-kubernetes-validations": [{
            "rule": "(has(self.sequence) ? 1 : 0) + (has(self.time) ? 1 : 0) + (has(self.delta) ? 1 : 0) + "
                    "(has(self.atEnd) ? 1 : 0) == 1",
            "message": "start takes exactly one of sequence, time, delta, atEnd"}],
        "oneOf": [{"required": ["sequence"]}, {"required": ["time"]}, {"required": ["delta"]},
                  {"required": ["atEnd"]}]}}

    sequence: int | None = field("Start at this source stream sequence.", None, format="int64", minimum=1)
    time: str | None = field("Start at the first message stored at or after this time (RFC 3339).", None,
                             format="date-time")
    delta: str | None = duration_field("Start this far back from now, e.g. `1h`.")
    at_end: Literal[True] | None = field("Start after the source's last message: only new messages are copied.",
                                         None)


class Sampling(Model):
    """Forward each sender at most once per `age`."""

    model_config = {"json_schema_extra": {
        "x-kubernetes-validations": [{
            "rule": "(has(self.inspect) ? 1 : 0) + (has(self.inspectHeader) ? 1 : 0) + "
                    "(has(self.inspectSubjectToken) ? 1 : 0) == 1",
            "message": "sampling takes exactly one of inspect, inspectHeader, inspectSubjectToken"}],
        "oneOf": [{"required": ["inspect"]}, {"required": ["inspectHeader"]}, {"required": ["inspectSubjectToken"]}]}}

    inspect: str | None = field("JSON field (dotted path) in the payload that names the sender.", None,
                                maxLength=255, pattern=r"^[^.\s]+(\.[^.\s]+)*$")
    inspect_header: str | None = field("Message header that names the sender.", None,
                                       maxLength=255, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
    inspect_subject_token: int | None = field("1-based subject token that names the sender.", None,
                                              minimum=1, maximum=255)
    age: str = field("Sampling interval per sender, e.g. `5m`.", maxLength=64, pattern=DURATION)
    update_flag: str | None = field("JSON field whose truthy value forces a copy.", None,
                                    maxLength=255, pattern=r"^[^.\s]+(\.[^.\s]+)*$")
    size_trigger: int | None = field(
        "Copy at once when a sender's payload size changes by at least this many bytes.", None, minimum=1)
    limiter_state: Literal["memory", "file", "kv"] | None = field(
        "Where sampling state lives. Default `kv` when more than one worker runs, else `file` (an emptyDir).", None)

    @model_validator(mode="after")
    def _one_key(self) -> Sampling:
        keys = [k for k in (self.inspect, self.inspect_header, self.inspect_subject_token) if k is not None]
        if len(keys) != 1:
            raise ValueError("spec.sampling takes exactly one of inspect, inspectHeader, inspectSubjectToken")
        return self


class Advisory(Model):
    subject: str = field("Subject the advisories are published to (a stream on that cluster should capture it).",
                         maxLength=255, pattern=LITERAL_SUBJECT)
    cluster: Literal["target", "source"] = field("Which side's cluster the advisories are published to.", "target")
    age: str | None = duration_field("Silence after which a `timeout` advisory is sent; default age/2.")


class HeartbeatSubject(Model):
    subject: str = field("Subject of this heartbeat.", maxLength=255, pattern=LITERAL_SUBJECT)
    interval: str | None = duration_field("This subject's interval; default the heartbeats' interval.")
    headers: dict[str, str] = field("This subject's headers; they win over the shared ones.", default_factory=dict)


class Heartbeats(Model):
    """Heartbeats published with one side's URL, credentials and TLS Secret."""

    cluster: Side = field("Which side's URL, credentials and TLS Secret to publish with.", "source")
    interval: str = field("Default interval of every subject.", "10s", maxLength=64, pattern=DURATION)
    leader_election: bool | None = field(
        "Only the elected pod publishes; default true when more than one pod runs.", None)
    headers: dict[str, str] = field("Headers on every heartbeat.", default_factory=dict)
    subjects: list[HeartbeatSubject] = field("The heartbeats: one subject each, with its own interval and headers.",
                                             minItems=1, maxItems=100)

    @field_validator("subjects")
    @classmethod
    def _some(cls, value: list[HeartbeatSubject]) -> list[HeartbeatSubject]:
        if not value:
            raise ValueError("spec.heartbeats.subjects needs at least one subject")
        return value


SPEC_RULES = [
    {"rule": "self.mode == 'scaled' || self.workersPerPod == 1",
     "message": "workersPerPod > 1 needs mode: scaled (ordered mode runs one active worker)"},
    {"rule": "!has(self.queueGroup) || self.mode == 'scaled'",
     "message": "queueGroup applies to mode: scaled only (ordered mode uses the durable `name`)"},
    {"rule": "!has(self.advisory) || has(self.sampling)",
     "message": "advisory needs sampling: advisories are about the senders that sampling tracks"},
    {"rule": "!has(self.fleetHealth) || has(self.advisory)",
     "message": "fleetHealth needs advisory: the Spark job aggregates the advisories"},
    {"rule": "!has(self.sampling) || !has(self.sampling.limiterState) || self.sampling.limiterState == 'kv' || "
             "(self.mode == 'ordered' && self.replicas <= 1)",
     "message": "sampling.limiterState must be kv when more than one worker runs (scaled mode or hot standbys): "
                "every worker must see the same limiter state"},
    {"rule": "self.mode == oldSelf.mode",
     "message": "mode is immutable: ordered and scaled mode use different durable consumers; create a new "
                "StreamReplication instead"},
    {"rule": "(has(self.name) ? self.name : '') == (has(oldSelf.name) ? oldSelf.name : '')",
     "message": "name is immutable: it names the durable consumer on the source"},
    {"rule": "(has(self.queueGroup) ? self.queueGroup : '') == (has(oldSelf.queueGroup) ? oldSelf.queueGroup : '')",
     "message": "queueGroup is immutable: it names the shared durable consumer on the source"},
    {"rule": "self.engine != 'native' || has(self.source.domain) || has(self.source.apiPrefix)",
     "message": "engine native needs source.domain or source.apiPrefix: how the target reaches the source's "
                "JetStream API"},
    {"rule": "self.engine != 'native' || (!has(self.sampling) && !has(self.advisory) && !has(self.fleetHealth) && "
             "!has(self.maxAge) && !has(self.deadLetter))",
     "message": "engine native cannot sample, advise, aggregate fleet health, skip old messages or dead-letter "
                "(sampling, advisory, fleetHealth, maxAge, deadLetter): use engine auto or replicator"},
    *POOL_RULES,
]


class StreamReplicationSpec(Model):
    """What the author of a StreamReplication asks for."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": SPEC_RULES}}

    engine: Engine = field(
        "Who copies: `native` (a source entry on the target stream, NATS copies), `replicator` (worker pods), or "
        "`auto` (native when the spec needs nothing only the replicator can do and the target reaches the source "
        "through source.domain or source.apiPrefix).", "auto")
    topic: str = field("Subject to copy from the source; wildcards (`*`, a final `>`) allowed.",
                       maxLength=255, pattern=r"^((\*|[^.*>\s]+)\.)*(\*|>|[^.*>\s]+)$")
    source: Source = field("Where messages are read.")
    target: Target = field("Where messages are published.")
    mode: Literal["ordered", "scaled"] = field(
        "`ordered`: one active worker, order kept. `scaled`: many workers share one durable consumer, unordered.",
        "ordered")
    replicas: int = field("Pods. Ordered mode runs one leader and replicas-1 hot standbys.", 1,
                          format="int32", minimum=0, maximum=256)
    workers_per_pod: int = field("Workers per pod (scaled mode only).", 1, format="int32", minimum=1, maximum=64)
    queue_group: str | None = field(
        "Shared durable consumer in scaled mode; default `<namespace>_<name>_grp`.", None,
        maxLength=200, pattern=JETSTREAM_NAME)
    name: str | None = field(
        "Replicator name; the ordered durable consumer and the worker name prefix. Default `<namespace>_<name>`.",
        None, maxLength=200, pattern=JETSTREAM_NAME)
    start: Start | None = field("Where a new consumer starts (first start only). Exactly one field.", None)
    max_age: str | None = duration_field("Acknowledge and skip source messages older than this, e.g. `1h`.")
    dead_letter: str | None = field(
        "Subject on the target cluster for poison messages (refused 5 times); a stream must capture it. Without "
        "it they are skipped. Counted and logged either way.", None, maxLength=255, pattern=LITERAL_SUBJECT)
    active_active: bool | None = field(
        "Two sites replicate into each other on purpose: a delivered copy that would loop (this replicator's own, "
        "or one from the target stream) is skipped and counted instead of stopping the worker. Default false.", None)
    sampling: Sampling | None = field("Forward each sender at most once per `age`; exactly one sampling key.", None)
    advisory: Advisory | None = field("Publish new/timeout/recover/expire advisories about senders.", None)
    heartbeats: Heartbeats | None = field(
        "Publish heartbeats (the Go Stream Replicator's, 0.8): a JetStream message per subject every interval, the "
        "unix time as body, Choria-SR-Originator and Choria-SR-Subject headers; into a replicated stream they keep "
        "an idle replication measurable end to end.", None)
    fleet_health: FleetHealth | None = field(
        "Aggregate the advisories into fleet-health tables with a ScheduledSparkApplication.", None)
    image: str | None = field(
        "Worker image; default the operator's own (its STREAM_REPLICATOR_WORKER_IMAGE, the chart's `workerImage`).",
        None, maxLength=512, minLength=1)
    resources: Resources | None = field("Worker container resources.", None)
    node_selector: dict[str, str] = field("Node labels the worker pods must run on (pod spec `nodeSelector`).",
                                          default_factory=dict)
    tolerations: list[Toleration] = field("Taints the worker pods tolerate (pod spec `tolerations`).",
                                          default_factory=list)
    affinity: dict[str, Any] | None = field("A core/v1 Affinity, passed to the pods unchanged.", None,
                                            **{"x-kubernetes-preserve-unknown-fields": True})
    pod_annotations: dict[str, str] = field("Annotations added to the worker pods.", default_factory=dict)
    service_account_name: str | None = name_field(
        "Service account the worker pods run as (the tenancy policy must allow it); default the namespace's "
        "default account, with no API token mounted.", None)
    template: WorkerTemplate | None = field(
        "Shapes the worker pods, their container and PodDisruptionBudget (image pull Secrets, priority, "
        "spreading, labels, env, securityContext); docs/operator.md#pod-templates.", None)
    monitoring: Monitoring = field("The workers' metrics endpoint and how Prometheus finds it.",
                                   default_factory=Monitoring, schema_default={})
    native: NativeSettings = field("The native engine's readiness bounds.", default_factory=NativeSettings,
                                   schema_default={})
    network_policy: NetworkPolicySettings = field("An optional NetworkPolicy for the worker pods.",
                                                  default_factory=NetworkPolicySettings, schema_default={})
    pool: str | None = field(POOL_DESCRIPTION, None, maxLength=POOL_NAME_MAX, pattern=POOL_NAME)

    @model_validator(mode="after")
    def _workers_need_scaled(self) -> StreamReplicationSpec:
        if self.mode == "ordered" and self.workers_per_pod != 1:
            raise ValueError("spec.workersPerPod > 1 needs mode: scaled")
        return self

    @model_validator(mode="after")
    def _pool_rules(self) -> StreamReplicationSpec:
        problems = pool_problems(self.pool, self.engine, self.heartbeats is not None, self.network_policy.enabled)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ReplicationSpec(StreamReplicationSpec):
    """One resource's spec as the builders read it: the typed spec, where the resource lives, and what
    follows from both (names, worker counts, the sampling state)."""

    _namespace: str = PrivateAttr("default")
    _resource_name: str = PrivateAttr("")

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def resource_name(self) -> str:
        return self._resource_name

    @property
    def replicator_name(self) -> str:
        """`spec.name`, or `<namespace>_<name>`: the ordered durable consumer, the worker-name prefix."""
        return self.name or naming.default_replicator_name(self.namespace, self.resource_name)

    @property
    def group_name(self) -> str:
        """`spec.queueGroup`, or `<namespace>_<name>_grp`: scaled mode's shared durable consumer."""
        return self.queue_group or naming.default_queue_group(self.namespace, self.resource_name)

    @property
    def ordered(self) -> bool:
        return self.mode == "ordered"

    @property
    def total_workers(self) -> int:
        """Worker processes that can run at once across all pods (standbys included)."""
        return self.replicas * (1 if self.ordered else self.workers_per_pod)

    @property
    def leader_election(self) -> bool:
        """Ordered hot standbys need election, or two pods would copy at once."""
        return self.ordered and self.replicas > 1

    @property
    def consumer_name(self) -> str:
        """The durable consumer on the source: the queue group (scaled) or the name (ordered)."""
        return self.replicator_name if self.ordered else self.group_name

    @property
    def limiter_state(self) -> str | None:
        """Sampling state: shared `kv` once more than one worker exists, else a `file` in an emptyDir."""
        if not self.sampling:
            return None
        if self.total_workers > 1:
            return "kv"
        return self.sampling.limiter_state or "file"

    def endpoint(self, side: Side) -> Endpoint:
        return self.source if side == "source" else self.target

    @property
    def advisory_endpoint(self) -> Endpoint | None:
        return self.endpoint(self.advisory.cluster) if self.advisory else None


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(["spec", *(str(part) for part in loc)])


def _problem(error: Mapping[str, Any]) -> str:
    """One validation error in the words of a resource's fields (its API names)."""
    where, kind = _where(tuple(error["loc"])), error["type"]
    if kind == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return f"{where} is required"
    if kind == "literal_error":
        allowed = str((error.get("ctx") or {}).get("expected", "")).replace("'", "")
        return f"{where} must be {allowed}, not {error['input']!r}"
    return f"{where}: {error['msg']}"


problem_text = _problem  # a NatsConnection's errors, in the same words (model/connection.py)


def parse_spec(resource: Mapping[str, Any]) -> ReplicationSpec:
    """The resource's spec, defaulted and typed; raises SpecError for what the schema should have caught."""
    meta = resource.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    resource_name = str(meta.get("name") or "")
    if not resource_name:
        raise SpecError("metadata.name is required")
    try:
        spec = ReplicationSpec.model_validate(resource.get("spec") or {})
    except ValidationError as err:
        problems = dict.fromkeys(_problem(e) for e in err.errors(include_url=False))
        raise SpecError("; ".join(problems)) from None
    spec._namespace, spec._resource_name = namespace, resource_name
    return spec
