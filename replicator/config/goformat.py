"""The Go Stream Replicator's config format (0.5-0.9): `name` and a `streams:` list.

Files written for the Go tool load unchanged and map onto the same model as legacy files, so the
data plane does not know which format it runs: each `streams[]` entry becomes a profile (its own
copier, all run by one process), named `<stream>_<name>` as the Go tool names its state files.
The Go tool's validation rules are kept (and stricter ones added: unknown keys and broken values
are errors naming the key); where its behaviour differs from its documentation, the documented
behaviour is what the mapping asks for (see docs/migration.md). Keys that cannot apply are
accepted with one warning each, returned in `GoFile.warnings` for the caller to log.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from replicator.config.durations import parse_go_duration
from replicator.config.errors import ConfigError, format_errors
from replicator.config.model import Config, GoIdentity
from replicator.config.urls import url_options

GoDuration = Annotated[float, BeforeValidator(parse_go_duration)]

ELECTION_BUCKET = "CHORIA_LEADER_ELECTION"
"""The Go tool's election bucket (on the source); sharing it lets both tools elect one leader."""

_GJSON_UNSUPPORTED = re.compile(r"[*?#@|\\!]")


class GoStrict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GoTLS(GoStrict):
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.ca or self.cert or self.key)

    @model_validator(mode="after")
    def _pair(self) -> GoTLS:
        if bool(self.cert) != bool(self.key):
            raise ValueError("cert and key go together")
        return self

    def as_model(self) -> dict[str, Any]:
        return {"scheme": "manual", **{k: v for k, v in (("ca", self.ca), ("cert", self.cert), ("key", self.key)) if v}}


class GoChoria(GoStrict):
    """A NATS user JWT and its nkey seed (`collective` is informational: no Choria inbox prefix)."""

    seed_file: str | None = None
    jwt_file: str | None = None
    collective: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.seed_file or self.jwt_file)

    @model_validator(mode="after")
    def _pair(self) -> GoChoria:
        if bool(self.seed_file) != bool(self.jwt_file):
            raise ValueError("jwt_file and seed_file go together (a user JWT and its nkey seed)")
        return self


class GoAdvisory(GoStrict):
    subject: str
    reliable: bool = False


class GoHeartbeatSubject(GoStrict):
    subject: str
    interval: GoDuration | None = None
    headers: dict[str, str] = Field(default_factory=dict)


class GoHeartbeats(GoStrict):
    url: str
    interval: GoDuration = 10.0
    leader_election: bool = False
    headers: dict[str, str] = Field(default_factory=dict)
    subjects: list[GoHeartbeatSubject] = Field(min_length=1)
    tls: GoTLS | None = None
    choria: GoChoria | None = None


def _name_part(value: str | None) -> str | None:
    """Names end up in consumer names (`SR_<name>`), so they follow JetStream's naming rules."""
    if value is not None and (not value or any(ch in value for ch in " \t.*>/\\")):
        raise ValueError(f"{value!r} cannot be part of a consumer name (SR_<name>): no spaces, '.', '*', '>' "
                         "or slashes")
    return value


def _gjson_path(value: str | None) -> str | None:
    if value and (_GJSON_UNSUPPORTED.search(value) or ".." in value or value.startswith(".") or value.endswith(".")):
        raise ValueError(f"{value!r}: only dotted paths (facts.host, items.0.name) are supported, not gjson "
                         "wildcards, queries, modifiers or escapes")
    return value or None


class GoStream(GoStrict):
    """One `streams[]` entry; see the research table in docs/configuration.md#go-format-stream-keys."""

    name: str | None = None
    stream: str
    target_stream: str | None = None
    filter_subject: str | None = None
    target_subject_prefix: str | None = None
    target_subject_remove: str | None = None
    source_url: str
    target_url: str
    target_initiated: bool = False
    no_target_create: bool = False
    ephemeral: bool = False
    start_sequence: int = Field(default=0, ge=0)
    start_time: dt.datetime | None = None
    start_delta: GoDuration = 0.0
    start_at_end: bool = False
    tls: GoTLS | None = None
    source_tls: GoTLS | None = None
    target_tls: GoTLS | None = None
    choria: GoChoria | None = None
    source_choria: GoChoria | None = None
    target_choria: GoChoria | None = None
    max_age: GoDuration = 0.0
    inspect_field: str | None = None
    inspect_force_field: str | None = None
    inspect_header: str | None = None
    inspect_subject_token: int = 0
    inspect_duration: GoDuration = 0.0
    warn_duration: GoDuration | None = None
    size_trigger: float = Field(default=0.0, ge=0)
    leader_election_name: str | None = None
    advisory: GoAdvisory | None = None

    @field_validator("inspect_field", "inspect_force_field")
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return _gjson_path(value)

    @field_validator("name", "stream")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return _name_part(value)

    @field_validator("inspect_subject_token")
    @classmethod
    def _token(cls, value: int) -> int:
        if value < -1:
            raise ValueError("must be -1 (the whole subject), 0 (off) or a 1-based token")
        return value

    @field_validator("size_trigger")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a number of bytes")
        return value

    @property
    def inspections(self) -> list[str]:
        return [k for k in ("inspect_field", "inspect_header", "inspect_subject_token") if getattr(self, k)]

    @model_validator(mode="after")
    def _go_rules(self) -> GoStream:
        """The Go tool's own checks (config.Validate, replicator.NewStream, the limiter)."""
        if not self.stream:
            raise ValueError("stream: required key is missing")
        if len(self.inspections) > 1:
            raise ValueError(f"only one inspection mode can be set per stream, not {self.inspections}")
        if self.inspect_force_field and not self.inspect_field:
            raise ValueError("inspect_force_field needs inspect_field")
        if self.target_initiated:
            if not self.filter_subject:
                raise ValueError("filter_subject is required with target_initiated")
            if self.max_age:
                raise ValueError("max_age cannot be used with target_initiated")
            if self.inspections:
                raise ValueError("message inspection and sampling cannot be used with target_initiated")
            if self.no_target_create:
                raise ValueError("target_initiated cannot be combined with no_target_create")
        return self


class GoConfig(GoStrict):
    name: str
    streams: list[GoStream] = Field(default_factory=list)
    state_store: str | None = None
    tls: GoTLS | None = None
    choria: GoChoria | None = None
    monitor_port: int = Field(default=0, ge=0, le=65535)
    profiling: bool | None = None
    logfile: str | None = None
    loglevel: Literal["debug", "info", "warn", "warning", "error", ""] = ""
    heartbeats: GoHeartbeats | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value:
            raise ValueError("name is required")
        return _name_part(value) or value

    @model_validator(mode="after")
    def _unique(self) -> GoConfig:
        if not self.streams and self.heartbeats is None:
            raise ValueError("streams: at least one stream (or heartbeats) is required")
        seen: set[tuple[str, str]] = set()
        for s in self.streams:
            pair = (s.stream, s.name or self.name)
            if pair in seen:
                raise ValueError(f"duplicate stream configuration name {pair[1]} for stream {pair[0]}")
            seen.add(pair)
        return self


class GoFile:
    """A parsed Go-format file: the model it maps to and what the mapping had to warn about."""

    def __init__(self, config: Config, warnings: list[str]) -> None:
        self.config = config
        self.warnings = warnings


def is_go_format(data: Any) -> bool:
    """`streams:` (a list, with the top-level `name`) is the Go tool; `topics:` (a map) is legacy.

    A file with neither is the Go tool's when only the Go format knows all its keys (a heartbeats-only
    file with `monitor_port`, say); otherwise it is left to the legacy loader to explain.
    """
    if not isinstance(data, dict) or "topics" in data:
        return False
    if "streams" in data:
        return True
    keys = set(data)
    return bool(keys - set(Config.model_fields)) and keys <= set(GoConfig.model_fields)


def parse_go_config(data: dict[str, Any], source: str) -> GoFile:
    try:
        go = GoConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_errors(err, source)) from None
    warnings: list[str] = []
    if go.profiling:
        warnings.append(f"{source}: profiling: accepted and ignored (the Go tool's pprof endpoints do not exist "
                        "here; /metrics, /healthz and /readyz are served on monitor_port)")
    topics: dict[str, dict[str, Any]] = {}
    identities: dict[str, GoIdentity] = {}
    for index, stream in enumerate(go.streams):
        profile, topic, identity = _map_stream(go, index, stream, warnings, source)
        topics[profile] = topic
        identities[profile] = identity
    mapped: dict[str, Any] = {"name": go.name, "topics": topics}
    if go.state_store:
        mapped["state_dir"] = go.state_store
    if go.logfile:  # the Go tool logs JSON to its logfile
        mapped.update(logfile=go.logfile, log_format="json")
    if go.loglevel:
        mapped["log_level"] = go.loglevel
    if go.heartbeats is not None:
        mapped["heartbeats"] = _map_heartbeats(go.heartbeats)
    try:
        config = Config.model_validate(mapped)
    except ValidationError as err:
        raise ConfigError(_go_errors(err, source, identities)) from None
    config._go = identities
    return GoFile(config, warnings)


def _resolve(stream: GoStream, go: GoConfig, index: int, kind: str, side: str) -> tuple[Any, str | None]:
    """The most specific of `<side>_<kind>`, the stream's `<kind>`, the global `<kind>`, and its key."""
    for value, key in ((getattr(stream, f"{side}_{kind}"), f"streams.{index}.{side}_{kind}"),
                       (getattr(stream, kind), f"streams.{index}.{kind}"), (getattr(go, kind), kind)):
        if value is not None:
            return value, key
    return None, None


def _map_stream(go: GoConfig, index: int, s: GoStream, warnings: list[str],
                source: str) -> tuple[str, dict[str, Any], GoIdentity]:
    name = s.name or go.name
    at = f"{source}: streams.{index}"
    keys: dict[str, str] = {"name": f"streams.{index}.name" if s.name else "name",
                            "durable": f"streams.{index}.name" if s.name else "name",
                            "topic": f"streams.{index}.filter_subject", "source_stream": f"streams.{index}.stream",
                            "age": f"streams.{index}.inspect_duration", "inspect": f"streams.{index}.inspect_field",
                            "update_flag": f"streams.{index}.inspect_force_field",
                            "advisory": f"streams.{index}.advisory", "monitor": "monitor_port",
                            "leader_election_bucket": f"streams.{index}.leader_election_name"}
    topic: dict[str, Any] = {
        "topic": s.filter_subject or ">",
        "source_stream": s.stream,
        "target_stream": s.target_stream or s.stream,
        "source_url": s.source_url,
        "target_url": s.target_url,
        "name": f"SR_{name}_{s.stream}",  # the Go tool's election key: unique per (stream, name)
        "durable": f"SR_{name}",
        "target_create": not s.no_target_create,
        "ephemeral": s.ephemeral,
    }
    for key in ("target_subject_prefix", "target_subject_remove"):
        if getattr(s, key):
            topic[key] = getattr(s, key)
    if go.monitor_port:
        topic["monitor"] = go.monitor_port

    # The Go tool picks one start option in this order, silently; we say so.
    starts = [("start_at_end", s.start_at_end), ("start_sequence", s.start_sequence),
              ("start_delta", s.start_delta), ("start_time", s.start_time)]
    given = [(k, v) for k, v in starts if v]
    if given:
        topic[given[0][0]] = given[0][1]
        if len(given) > 1:
            warnings.append(f"{at}: several start options ({', '.join(k for k, _ in given)}): "
                            f"{given[0][0]} is used, as the Go tool does")
    if s.max_age:
        topic["max_age"] = s.max_age

    for side in ("source", "target"):
        tls, tls_key = _resolve(s, go, index, "tls", side)
        if tls is not None and not tls.empty and tls_key:
            topic[f"{side}_tls"] = tls.as_model()
            keys[f"{side}_tls"] = tls_key
        choria, choria_key = _resolve(s, go, index, "choria", side)
        try:
            opts = url_options(getattr(s, f"{side}_url"))
        except ValueError:
            opts = None  # the model names the URL's problem
        if opts is not None and (opts.credentials or opts.jwt or opts.userinfo):
            choria = None  # the URL's credentials come later in the Go tool's options, and win
        if choria is not None and not choria.empty:
            topic[f"{side}_jwt_file"], topic[f"{side}_seed_file"] = choria.jwt_file, choria.seed_file
            keys[f"{side}_jwt_file"] = f"{choria_key}.jwt_file"
            keys[f"{side}_seed_file"] = f"{choria_key}.seed_file"

    if s.inspections and not s.inspect_duration:
        warnings.append(f"{at}: {s.inspections[0]} without inspect_duration: sampling is off, "
                        "as in the Go tool (set inspect_duration to sample)")
    elif s.inspections:
        sampling: dict[str, Any] = {"age": s.inspect_duration}
        if s.inspect_field:
            sampling["inspect"] = s.inspect_field
        elif s.inspect_header:
            sampling["inspect_header"] = s.inspect_header
        else:
            sampling["inspect_subject_token"] = s.inspect_subject_token
        if s.inspect_force_field:
            sampling["update_flag"] = s.inspect_force_field
        if s.size_trigger:
            sampling["size_trigger"] = max(1, math.ceil(s.size_trigger))
        # Replicas of an elected stream share what they track (the Go tool gossips it).
        sampling["limiter_state"] = "kv" if s.leader_election_name else "file" if go.state_store else "memory"
        if s.advisory is not None:
            advisory: dict[str, Any] = {"target": s.advisory.subject, "cluster": "source", "format": "v2",
                                        "reliable": s.advisory.reliable}
            if s.warn_duration:
                advisory["age"] = s.warn_duration
            sampling["advisory"] = advisory
            keys["advisory.target"] = f"streams.{index}.advisory.subject"
            keys["advisory.age"] = f"streams.{index}.warn_duration"
        topic.update(sampling)
    if s.advisory is not None and "advisory" not in topic:
        warnings.append(f"{at}: advisory without sampling (inspect_* and inspect_duration): no advisories, "
                        "as in the Go tool")
    if s.leader_election_name:
        topic.update(leader_election=True, leader_election_bucket=ELECTION_BUCKET)
    if s.target_initiated:
        warnings.append(f"{at}: target_initiated: copied by the pipelined ordered copier, which is fast over "
                        "long links wherever it runs (headers are kept, unlike the Go tool's push mode)")
    identity = GoIdentity(replicator=go.name, name=name, stream=s.stream, index=index, keys=keys,
                          election_name=s.leader_election_name)
    return f"{s.stream}_{name}", topic, identity


def _map_heartbeats(hb: GoHeartbeats) -> dict[str, Any]:
    out: dict[str, Any] = {
        "url": hb.url,
        "interval": hb.interval,
        "leader_election": hb.leader_election,
        "headers": dict(hb.headers),
        "subjects": [{"subject": s.subject, "headers": dict(s.headers),
                      **({"interval": s.interval} if s.interval else {})} for s in hb.subjects],
    }
    if hb.leader_election:
        out["leader_election_bucket"] = ELECTION_BUCKET
    if hb.tls is not None and not hb.tls.empty:
        out["tls"] = hb.tls.as_model()
    try:
        opts = url_options(hb.url)
    except ValueError:
        opts = None  # the model names the URL's problem
    if opts is not None and (opts.credentials or opts.jwt or opts.userinfo):
        return out  # the URL's credentials win over `choria`, as for a stream
    if hb.choria is not None and not hb.choria.empty:
        out.update(jwt_file=hb.choria.jwt_file, seed_file=hb.choria.seed_file)
    return out


_TOP_KEYS = {"state_dir": "state_store", "log_level": "loglevel", "log_format": "logfile"}


def _go_errors(err: ValidationError, source: str, identities: dict[str, GoIdentity]) -> str:
    """Errors of the mapped model, located at the Go keys they came from (each reported once)."""
    lines: list[str] = []
    for line in format_errors(err, source).splitlines():
        loc, _, msg = line.removeprefix(f"{source}: ").partition(": ")
        for profile, ident in identities.items():
            if loc == f"topics.{profile}" or loc.startswith(f"topics.{profile}."):
                key = loc.removeprefix(f"topics.{profile}").lstrip(".")
                loc = ident.keys.get(key) or (f"streams.{ident.index}.{key}" if key else f"streams.{ident.index}")
                break
        else:
            head, _, tail = loc.partition(".")
            if head in _TOP_KEYS:
                loc = ".".join(p for p in (_TOP_KEYS[head], tail) if p)
        text = f"{source}: {loc}: {msg}" if msg else line
        if text not in lines:
            lines.append(text)
    return "\n".join(lines)
