"""The worker's YAML config (the format of `replicator/config.py`) built from a StreamReplication.

The config is the whole contract between operator and worker: everything a pod needs, apart from
its own identity (`SR_INSTANCE`, from the downward API), is in it. It is rendered with sorted keys
so that its hash only changes when its meaning does; that hash rolls the pods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any

import yaml
from pydantic import ValidationError
from replication_operator.model import naming
from replication_operator.model.spec import TLS_CA, TLS_CERT, TLS_KEY, ReplicationSpec, Side, SpecError

from replicator.config import Config

ALL_TLS_KEYS = frozenset({TLS_CA, TLS_CERT, TLS_KEY})


def credentials_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-credentials"


def tls_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-tls"


def basic_auth_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-basic-auth"


def credentials_path(spec: ReplicationSpec, side: Side) -> str | None:
    ref = spec.endpoint(side).credentials
    return f"{credentials_dir(side)}/{ref.key}" if ref else None


def basic_auth_paths(spec: ReplicationSpec, side: Side) -> tuple[str, str] | None:
    """The mounted user name and password files: paths in the config, the values only in the pod."""
    ref = spec.endpoint(side).basic_auth
    if ref is None:
        return None
    return f"{basic_auth_dir(side)}/{ref.username_key}", f"{basic_auth_dir(side)}/{ref.password_key}"


def tls_settings(spec: ReplicationSpec, side: Side, keys: Collection[str]) -> dict[str, str] | None:
    """`scheme: manual` TLS for one side, naming only the files the Secret really has."""
    secret = spec.endpoint(side).tls_secret
    if not secret:
        return None
    base = tls_dir(side)
    tls: dict[str, str] = {"scheme": "manual"}
    if TLS_CA in keys:
        tls["ca"] = f"{base}/{TLS_CA}"
    if TLS_CERT in keys and TLS_KEY in keys:
        tls["cert"] = f"{base}/{TLS_CERT}"
        tls["key"] = f"{base}/{TLS_KEY}"
    return tls


def build_worker_config(
    spec: ReplicationSpec, tls_keys: Mapping[str, Collection[str]] | None = None, resume_after: int | None = None
) -> dict[str, Any]:
    """The config dict; `tls_keys` maps a TLS Secret's name to the keys it holds (all three if unknown);
    `resume_after`: the last source sequence the native engine delivered before the replicator took over."""
    topic: dict[str, Any] = {
        "topic": spec.topic,
        "source_url": spec.source.url,
        "target_url": spec.target.url,
        "name": spec.name,
        "target_create": spec.target.create,
        "monitor": spec.monitoring_port,
    }
    optional = {
        "source_stream": spec.source.stream,
        "target_stream": spec.target.stream,
        "target_subject_prefix": spec.target.subject_prefix,
        "target_subject_remove": spec.target.subject_remove,
        "target_replicas": spec.target.replicas,
        "max_age": spec.max_age,
        "dead_letter": spec.dead_letter,
    }
    topic.update({k: v for k, v in optional.items() if v is not None})

    if spec.ordered:
        topic["workers"] = 1
        topic["queued"] = False
        if spec.leader_election:
            topic["leader_election"] = True
    else:
        topic["workers"] = spec.workers_per_pod
        topic["queued"] = True
        topic["queue_group"] = spec.queue_group

    start = spec.start
    if "sequence" in start:
        topic["start_sequence"] = int(start["sequence"])
    elif "time" in start:
        topic["start_time"] = str(start["time"])
    elif "delta" in start:
        topic["start_delta"] = str(start["delta"])
    elif start.get("atEnd"):
        topic["start_at_end"] = True
    if resume_after:
        topic["resume_after"] = int(resume_after)

    if spec.sampling:
        s = spec.sampling
        sampling = {
            "inspect": s.inspect,
            "inspect_header": s.inspect_header,
            "inspect_subject_token": s.inspect_subject_token,
            "age": s.age,
            "update_flag": s.update_flag,
            "size_trigger": s.size_trigger,
            "limiter_state": spec.limiter_state,
        }
        topic.update({k: v for k, v in sampling.items() if v is not None})
    if spec.advisory:
        advisory: dict[str, Any] = {"target": spec.advisory.subject, "cluster": spec.advisory.cluster}
        if spec.advisory.age:
            advisory["age"] = spec.advisory.age
        topic["advisory"] = advisory

    sides: tuple[Side, Side] = ("source", "target")
    for side in sides:
        creds = credentials_path(spec, side)
        if creds:
            topic[f"{side}_credentials"] = creds
        basic = basic_auth_paths(spec, side)
        if basic:
            topic[f"{side}_user_file"], topic[f"{side}_password_file"] = basic
        secret = spec.endpoint(side).tls_secret
        keys = (tls_keys or {}).get(secret or "", ALL_TLS_KEYS)
        tls = tls_settings(spec, side, keys)
        if tls:
            topic[f"{side}_tls"] = tls

    config: dict[str, Any] = {
        "log_format": "json",
        "state_dir": naming.STATE_DIR,
        "topics": {naming.profile(spec.resource_name): topic},
    }
    if spec.heartbeats:
        config["name"] = spec.name  # every pod's heartbeat election key: SR_<name>_HB
        config["heartbeats"] = heartbeats_settings(spec, topic)
    return config


def heartbeats_settings(spec: ReplicationSpec, topic: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's `heartbeats`, published with the chosen side's URL, credentials and TLS files."""
    hb = spec.heartbeats
    assert hb is not None
    side = hb.cluster
    election = hb.leader_election if hb.leader_election is not None else spec.replicas > 1
    out: dict[str, Any] = {
        "url": spec.endpoint(side).url,
        "interval": hb.interval,
        "leader_election": election,
        "headers": dict(hb.headers),
        "subjects": [{"subject": s.subject, "headers": dict(s.headers), **({"interval": s.interval} if s.interval
                                                                            else {})} for s in hb.subjects],
    }
    for key in ("credentials", "user_file", "password_file"):
        if f"{side}_{key}" in topic:
            out[key] = topic[f"{side}_{key}"]
    if f"{side}_tls" in topic:
        out["tls"] = topic[f"{side}_tls"]
    return out


def render(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=True, default_flow_style=False)


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate(config: Mapping[str, Any]) -> None:
    """The worker's own model accepts it (file checks aside: the files exist only in the pod)."""
    try:
        Config.model_validate(dict(config))
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
            msg = str(e["msg"]).removeprefix("Value error, ")
            problems.append(f"{loc}: {msg}")
        raise SpecError("the worker config would be invalid: " + "; ".join(problems)) from None
