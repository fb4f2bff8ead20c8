"""A typed, defaulted view of a StreamReplication's spec.

The API server applies the CRD's defaults, but objects written before a default existed (and the
test emulator) may lack them, so the builders read the spec through this view only. `DEFAULTS`
mirrors the CRD's `default:` values; a test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from replication_operator.model import naming

from replicator.config.urls import url_options

DEFAULTS: dict[str, Any] = {
    "engine": "auto",
    "mode": "ordered",
    "replicas": 1,
    "workersPerPod": 1,
    "source.credentialsSecret.key": "user.creds",
    "source.basicAuthSecret.usernameKey": "username",
    "source.basicAuthSecret.passwordKey": "password",
    "target.credentialsSecret.key": "user.creds",
    "target.basicAuthSecret.usernameKey": "username",
    "target.basicAuthSecret.passwordKey": "password",
    "target.create": True,
    "advisory.cluster": "target",
    "heartbeats.cluster": "source",
    "heartbeats.interval": "10s",
    "fleetHealth.suspend": False,
    "fleetHealth.kvBucket": "FLEET_HEALTH",
    "fleetHealth.s3.credentialsSecret.accessKeyIdKey": "AWS_ACCESS_KEY_ID",
    "fleetHealth.s3.credentialsSecret.secretAccessKeyKey": "AWS_SECRET_ACCESS_KEY",
    "monitoring": {},
    "monitoring.port": 8080,
    "monitoring.serviceMonitor.enabled": False,
}

TLS_CA = "ca.crt"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

Side = Literal["source", "target"]
Engine = Literal["auto", "native", "replicator"]


class SpecError(ValueError):
    """The spec cannot be turned into a worker config (the CRD schema normally prevents it)."""


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class BasicAuthRef:
    """A user name and password in one Secret (the keys of a `kubernetes.io/basic-auth` Secret)."""

    name: str
    username_key: str = "username"
    password_key: str = "password"

    @property
    def keys(self) -> tuple[str, str]:
        return self.username_key, self.password_key


@dataclass(frozen=True)
class Endpoint:
    """One side of the replication: NATS URL, stream and the Secrets to reach it."""

    side: Side
    url: str
    stream: str | None = None
    credentials: SecretKeyRef | None = None
    tls_secret: str | None = None
    basic_auth: BasicAuthRef | None = None

    @property
    def secrets(self) -> list[str]:
        """The Secrets this side reads (credentials, user and password, TLS), each once."""
        names = [self.credentials.name if self.credentials else None,
                 self.basic_auth.name if self.basic_auth else None, self.tls_secret]
        return list(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True)
class Source(Endpoint):
    """How the *target* reaches the source's JetStream API (the native engine): a JetStream domain,
    or an API prefix imported into the target's account (with its deliver prefix)."""

    domain: str | None = None
    api_prefix: str | None = None
    deliver_prefix: str | None = None


@dataclass(frozen=True)
class Target(Endpoint):
    subject_prefix: str | None = None
    subject_remove: str | None = None
    create: bool = True
    replicas: int | None = None  # of a target stream created (None: the source's)


@dataclass(frozen=True)
class Sampling:
    age: str
    inspect: str | None = None
    inspect_header: str | None = None
    inspect_subject_token: int | None = None
    update_flag: str | None = None
    size_trigger: int | None = None
    limiter_state: str | None = None


@dataclass(frozen=True)
class Advisory:
    subject: str
    cluster: Side = "target"
    age: str | None = None


@dataclass(frozen=True)
class HeartbeatSubject:
    subject: str
    interval: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HeartbeatsSpec:
    """Heartbeats published with one side's URL, credentials and TLS Secret."""

    subjects: list[HeartbeatSubject]
    cluster: Side = "source"
    interval: str = "10s"
    leader_election: bool | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceMonitorSpec:
    enabled: bool = False
    interval: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetHealth:
    kv_bucket: str
    url: str | None
    raw: dict[str, Any]


@dataclass(frozen=True)
class ReplicationSpec:
    namespace: str
    resource_name: str
    topic: str
    source: Source
    target: Target
    mode: Literal["ordered", "scaled"]
    replicas: int
    workers_per_pod: int
    name: str
    queue_group: str
    start: dict[str, Any]
    max_age: str | None
    sampling: Sampling | None
    advisory: Advisory | None
    fleet_health: FleetHealth | None
    heartbeats: HeartbeatsSpec | None
    image: str | None
    resources: dict[str, Any] | None
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    affinity: dict[str, Any] | None
    pod_annotations: dict[str, str]
    service_account_name: str | None
    monitoring_port: int
    service_monitor: ServiceMonitorSpec
    engine: Engine = "auto"
    dead_letter: str | None = None

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
        return self.name if self.ordered else self.queue_group

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


def _get(data: Mapping[str, Any], path: str) -> Any:
    """A dotted-path lookup that falls back to `DEFAULTS`."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return DEFAULTS.get(path)
        node = node[part]
    return node


def _secret(data: Mapping[str, Any], side: str) -> SecretKeyRef | None:
    ref = _get(data, f"{side}.credentialsSecret")
    if not ref:
        return None
    if not ref.get("name"):
        raise SpecError(f"spec.{side}.credentialsSecret.name is required")
    key = ref.get("key") or DEFAULTS[f"{side}.credentialsSecret.key"]
    return SecretKeyRef(name=str(ref["name"]), key=str(key))


def _basic_auth(data: Mapping[str, Any], side: str) -> BasicAuthRef | None:
    ref = _get(data, f"{side}.basicAuthSecret")
    if not ref:
        return None
    if not isinstance(ref, Mapping) or not ref.get("name"):
        raise SpecError(f"spec.{side}.basicAuthSecret.name is required")
    keys = [str(ref.get(k) or DEFAULTS[f"{side}.basicAuthSecret.{k}"]) for k in ("usernameKey", "passwordKey")]
    if keys[0] == keys[1]:
        raise SpecError(f"spec.{side}.basicAuthSecret: usernameKey and passwordKey must differ, not both {keys[0]!r}")
    return BasicAuthRef(name=str(ref["name"]), username_key=keys[0], password_key=keys[1])


def auth_ways(side: Side, section: Mapping[str, Any]) -> list[str]:
    """The ways a side authenticates, as the fields that give them: Secrets and what its URL carries."""
    ways = [f"spec.{side}.{k}" for k in ("credentialsSecret", "basicAuthSecret") if section.get(k)]
    try:
        opts = url_options(str(section.get("url") or ""))
    except ValueError:
        return ways  # the worker config's validation names the URL's problem
    if opts.userinfo:
        ways.append(f"a {opts.userinfo} in spec.{side}.url")
    ways += [f"?{k}= in spec.{side}.url" for k in ("credentials", "jwt") if getattr(opts, k)]
    return ways


def _endpoint(data: Mapping[str, Any], side: Side) -> dict[str, Any]:
    section = data.get(side)
    if not isinstance(section, Mapping) or not section.get("url"):
        raise SpecError(f"spec.{side}.url is required")
    ways = auth_ways(side, section)
    if len(ways) > 1:
        raise SpecError(f"{' and '.join(ways)} exclude each other: one way to authenticate the {side}")
    return {
        "side": side,
        "url": str(section["url"]),
        "stream": section.get("stream"),
        "credentials": _secret(data, side),
        "tls_secret": section.get("tlsSecret"),
        "basic_auth": _basic_auth(data, side),
    }


def _stream_replicas(value: Any) -> int | None:
    """`spec.target.replicas`: what NATS allows a stream (1 to 5), or None for the source's."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise SpecError(f"spec.target.replicas must be 1 to 5, not {value!r}")
    return value


def parse_spec(resource: Mapping[str, Any]) -> ReplicationSpec:
    """The resource's spec, defaulted and typed; raises SpecError for what the schema should have caught."""
    meta = resource.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    resource_name = str(meta.get("name") or "")
    if not resource_name:
        raise SpecError("metadata.name is required")
    data: Mapping[str, Any] = resource.get("spec") or {}
    if not data.get("topic"):
        raise SpecError("spec.topic is required")

    mode = _get(data, "mode")
    if mode not in ("ordered", "scaled"):
        raise SpecError(f"spec.mode must be ordered or scaled, not {mode!r}")
    workers = int(_get(data, "workersPerPod"))
    if mode == "ordered" and workers != 1:
        raise SpecError("spec.workersPerPod > 1 needs mode: scaled")

    sampling = None
    if data.get("sampling"):
        s = data["sampling"]
        keys = [k for k in ("inspect", "inspectHeader", "inspectSubjectToken") if s.get(k) is not None]
        if len(keys) != 1:
            raise SpecError("spec.sampling takes exactly one of inspect, inspectHeader, inspectSubjectToken")
        if not s.get("age"):
            raise SpecError("spec.sampling.age is required")
        sampling = Sampling(
            age=str(s["age"]),
            inspect=s.get("inspect"),
            inspect_header=s.get("inspectHeader"),
            inspect_subject_token=s.get("inspectSubjectToken"),
            update_flag=s.get("updateFlag"),
            size_trigger=s.get("sizeTrigger"),
            limiter_state=s.get("limiterState"),
        )

    advisory = None
    if data.get("advisory"):
        a = data["advisory"]
        advisory = Advisory(
            subject=str(a["subject"]), cluster=_get(data, "advisory.cluster"), age=a.get("age")
        )

    heartbeats = None
    if data.get("heartbeats"):
        hb = data["heartbeats"]
        if not isinstance(hb, Mapping):
            raise SpecError("spec.heartbeats must be an object with a subjects list")
        subjects = [HeartbeatSubject(subject=str(s["subject"]), interval=s.get("interval"),
                                     headers={str(k): str(v) for k, v in (s.get("headers") or {}).items()})
                    for s in hb.get("subjects") or [] if isinstance(s, Mapping) and s.get("subject")]
        if not subjects:
            raise SpecError("spec.heartbeats.subjects needs at least one subject")
        heartbeats = HeartbeatsSpec(
            subjects=subjects, cluster=_get(data, "heartbeats.cluster"),
            interval=str(_get(data, "heartbeats.interval")),
            leader_election=hb.get("leaderElection"),
            headers={str(k): str(v) for k, v in (hb.get("headers") or {}).items()},
        )

    fleet = None
    if data.get("fleetHealth"):
        f = data["fleetHealth"]
        fleet = FleetHealth(kv_bucket=str(_get(data, "fleetHealth.kvBucket")), url=f.get("url"), raw=dict(f))

    engine = _get(data, "engine")
    if engine not in ("auto", "native", "replicator"):
        raise SpecError(f"spec.engine must be auto, native or replicator, not {engine!r}")
    src = data["source"] if isinstance(data.get("source"), Mapping) else {}
    if src.get("domain") and src.get("apiPrefix"):
        raise SpecError("spec.source takes domain or apiPrefix, not both")
    if src.get("deliverPrefix") and not src.get("apiPrefix"):
        raise SpecError("spec.source.deliverPrefix needs spec.source.apiPrefix")

    sm = _get(data, "monitoring.serviceMonitor") or {}
    target = _endpoint(data, "target")
    tsec = data["target"]
    return ReplicationSpec(
        namespace=namespace,
        resource_name=resource_name,
        topic=str(data["topic"]),
        source=Source(
            **_endpoint(data, "source"),
            domain=src.get("domain"),
            api_prefix=src.get("apiPrefix"),
            deliver_prefix=src.get("deliverPrefix"),
        ),
        target=Target(
            **target,
            subject_prefix=tsec.get("subjectPrefix"),
            subject_remove=tsec.get("subjectRemove"),
            create=bool(_get(data, "target.create")),
            replicas=_stream_replicas(tsec.get("replicas")),
        ),
        mode=mode,
        replicas=int(_get(data, "replicas")),
        workers_per_pod=workers,
        name=str(data.get("name") or naming.default_replicator_name(namespace, resource_name)),
        queue_group=str(data.get("queueGroup") or naming.default_queue_group(namespace, resource_name)),
        start=dict(data.get("start") or {}),
        max_age=data.get("maxAge"),
        sampling=sampling,
        advisory=advisory,
        fleet_health=fleet,
        heartbeats=heartbeats,
        image=data.get("image"),
        resources=data.get("resources"),
        node_selector=dict(data.get("nodeSelector") or {}),
        tolerations=list(data.get("tolerations") or []),
        affinity=data.get("affinity"),
        pod_annotations=dict(data.get("podAnnotations") or {}),
        service_account_name=data.get("serviceAccountName"),
        monitoring_port=int(_get(data, "monitoring.port")),
        service_monitor=ServiceMonitorSpec(
            enabled=bool(sm.get("enabled", DEFAULTS["monitoring.serviceMonitor.enabled"])),
            interval=sm.get("interval"),
            labels=dict(sm.get("labels") or {}),
        ),
        engine=engine,
        dead_letter=data.get("deadLetter"),
    )
