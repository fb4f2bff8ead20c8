"""The worker's config (the format `replicator/config/model.py` reads) built from a StreamReplication.

The config is the whole contract between operator and worker: everything a pod needs, apart from
its own identity (`SR_INSTANCE`, from the downward API), is in it. It is built from the typed spec
and checked by the worker's own model (`replicator.config.Config`) as it is built, so a config the
worker would refuse is an InvalidSpec here, naming the key. The ConfigMap carries the spec's own
spellings (`age: 5m`, not the seconds the model reads), rendered with sorted keys, so that its
hash only changes when the spec does; that hash rolls the pods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from replication_operator.model import naming
from replication_operator.model.spec import TLS_CA, TLS_CERT, TLS_KEY, ReplicationSpec, Side, SpecError

from replicator.config import Config

ALL_TLS_KEYS = frozenset({TLS_CA, TLS_CERT, TLS_KEY})
SIDES: tuple[Side, Side] = ("source", "target")


def credentials_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-credentials"


def tls_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-tls"


def basic_auth_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-basic-auth"


def ca_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-ca"


def token_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-token"


def nkey_dir(side: Side) -> str:
    return f"{naming.SECRETS_DIR}/{side}-nkey"


@dataclass(frozen=True)
class WorkerConfig:
    """The config as the worker's model reads it (`model`) and as the ConfigMap carries it (`text`)."""

    model: Config
    text: str

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def connection_files(spec: ReplicationSpec, side: Side, keys: Collection[str]) -> dict[str, Any]:
    """One side's mounted files, by the config's keys without the side's prefix: a `.creds` file, a user
    name and password file, and `scheme: manual` TLS naming only the files the Secret really has."""
    endpoint = spec.endpoint(side)
    files: dict[str, Any] = {}
    if endpoint.credentials_secret:
        files["credentials"] = f"{credentials_dir(side)}/{endpoint.credentials_secret.key}"
    if endpoint.basic_auth_secret:
        ref = endpoint.basic_auth_secret
        files["user_file"] = f"{basic_auth_dir(side)}/{ref.username_key}"
        files["password_file"] = f"{basic_auth_dir(side)}/{ref.password_key}"
    if endpoint.token_secret:
        files["token_file"] = f"{token_dir(side)}/{endpoint.token_secret.key}"
    if endpoint.nkey_secret:
        files["nkey_file"] = f"{nkey_dir(side)}/{endpoint.nkey_secret.key}"
    if endpoint.tls_secret or endpoint.ca_config_map:
        base = tls_dir(side)
        tls: dict[str, str] = {"scheme": "manual"}
        ca, cert, key = endpoint.tls_names
        if endpoint.tls_secret and ca in keys:
            tls["ca"] = f"{base}/{ca}"
        if endpoint.tls_secret and cert in keys and key in keys:
            tls["cert"] = f"{base}/{cert}"
            tls["key"] = f"{base}/{key}"
        if endpoint.ca_config_map:  # trust-manager's bundle wins over the Secret's CA
            tls["ca"] = f"{ca_dir(side)}/{endpoint.ca_config_map.key}"
        files["tls"] = tls
    return files


def _topic(spec: ReplicationSpec, tls_keys: Mapping[str, Collection[str]], resume_after: int | None) -> dict[str, Any]:
    """The worker's topic settings, each key of `replicator.config.TopicConfig`."""
    topic: dict[str, Any] = {
        "topic": spec.topic,
        "source_url": spec.source.url,
        "target_url": spec.target.url,
        "name": spec.replicator_name,
        "target_create": spec.target.create,
        "monitor": spec.monitoring.port,
    }
    optional = {
        "source_stream": spec.source.stream,
        "target_stream": spec.target.stream,
        "target_subject_prefix": spec.target.subject_prefix,
        "target_subject_remove": spec.target.subject_remove,
        "target_replicas": spec.target.replicas,
        "target_max_msgs": spec.target.max_msgs,
        "target_max_bytes": spec.target.max_bytes,
        "target_max_age": spec.target.max_age,
        "target_max_msgs_per_subject": spec.target.max_msgs_per_subject,
        "target_discard": spec.target.discard,
        "max_age": spec.max_age,
        "dead_letter": spec.dead_letter,
        "active_active": spec.active_active or None,
    }
    topic.update({k: v for k, v in optional.items() if v is not None})
    if spec.ordered:
        topic.update(workers=1, queued=False)
        if spec.leader_election:
            topic["leader_election"] = True
    else:
        topic.update(workers=spec.workers_per_pod, queued=True, queue_group=spec.group_name)

    start = spec.start
    if start is not None and start.sequence is not None:
        topic["start_sequence"] = start.sequence
    elif start is not None and start.time is not None:
        topic["start_time"] = start.time
    elif start is not None and start.delta is not None:
        topic["start_delta"] = start.delta
    elif start is not None and start.at_end:
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

    for side in SIDES:
        keys = tls_keys.get(spec.endpoint(side).tls_secret or "", spec.endpoint(side).tls_names)
        topic.update({f"{side}_{k}": v for k, v in connection_files(spec, side, keys).items()})
    return topic


def _heartbeats(spec: ReplicationSpec, tls_keys: Mapping[str, Collection[str]]) -> dict[str, Any]:
    """The worker's `heartbeats`, published with the chosen side's URL, credentials and TLS files."""
    hb = spec.heartbeats
    assert hb is not None
    side = hb.cluster
    election = hb.leader_election if hb.leader_election is not None else spec.replicas > 1
    keys = tls_keys.get(spec.endpoint(side).tls_secret or "", spec.endpoint(side).tls_names)
    return {
        "url": spec.endpoint(side).url,
        "interval": hb.interval,
        "leader_election": election,
        "headers": dict(hb.headers),
        "subjects": [{"subject": s.subject, "headers": dict(s.headers), **({"interval": s.interval} if s.interval
                                                                            else {})} for s in hb.subjects],
        **connection_files(spec, side, keys),
    }


def build_worker_config(spec: ReplicationSpec, tls_keys: Mapping[str, Collection[str]] | None = None,
                        resume_after: int | None = None) -> WorkerConfig:
    """`tls_keys` maps a TLS Secret's name to the keys it holds (all three if unknown); `resume_after`:
    the last source sequence the native engine delivered before the replicator took over. Raises
    SpecError when the worker's model refuses the config (file checks aside: the files exist only
    in the pod)."""
    document: dict[str, Any] = {
        "log_format": "json",
        "state_dir": naming.STATE_DIR,
        "topics": {naming.profile(spec.resource_name): _topic(spec, tls_keys or {}, resume_after)},
    }
    if spec.heartbeats:
        document["name"] = spec.replicator_name  # every pod's heartbeat election key: SR_<name>_HB
        document["heartbeats"] = _heartbeats(spec, tls_keys or {})
    return _checked(document)


def build_pool_config(members: Sequence[tuple[ReplicationSpec, int | None]],
                      tls_keys: Mapping[str, Collection[str]] | None = None,
                      kept: Mapping[str, Mapping[str, Any]] | None = None) -> WorkerConfig:
    """One pooled worker's config: a profile per member (its spec, its `resume_after`), named by its
    resource as a lone worker's is, and the `kept` profiles as they run. Members share their pods,
    so the TLS Secrets' keys hold for all."""
    topics = {name: dict(topic) for name, topic in (kept or {}).items()}
    topics.update({naming.profile(spec.resource_name): _topic(spec, tls_keys or {}, resume_after)
                   for spec, resume_after in members})
    document: dict[str, Any] = {"log_format": "json", "state_dir": naming.STATE_DIR, "topics": topics}
    return _checked(document)


def _checked(document: dict[str, Any]) -> WorkerConfig:
    """The document as the worker's model reads it; SpecError naming each key it refuses."""
    try:
        model = Config.model_validate(document)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
            msg = str(e["msg"]).removeprefix("Value error, ")
            problems.append(f"{loc}: {msg}")
        raise SpecError("the worker config would be invalid: " + "; ".join(problems)) from None
    return WorkerConfig(model, yaml.safe_dump(document, sort_keys=True, default_flow_style=False))
