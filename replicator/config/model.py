"""The YAML config file: seed-compatible with the legacy tool, validated with errors that name key and file.

A config holds global settings and `topics`, a map of profile name to topic settings; one process
runs one profile (`--topic`). Everything is validated up front so a bad file fails at start with
exit status 2, never half-way through copying.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from replicator.config.durations import parse_duration
from replicator.config.errors import ConfigError
from replicator.config.urls import UrlOptions, split_urls, url_options

Duration = Annotated[float, BeforeValidator(parse_duration)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSConfig(Strict):
    """`manual` names the files; `puppet` finds them under `ssl_dir` by `identity`."""

    identity: str | None = None
    scheme: Literal["puppet", "manual"] = "manual"
    ssl_dir: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure: bool = False
    handshake_first: bool = False

    @model_validator(mode="after")
    def _complete(self) -> TLSConfig:
        if self.scheme == "puppet" and not self.ssl_dir:
            raise ValueError("scheme 'puppet' needs ssl_dir")
        if self.scheme == "manual" and bool(self.cert) != bool(self.key):
            raise ValueError("cert and key go together")
        return self

    def files(self) -> tuple[str | None, str | None, str | None]:
        """(ca, cert, key) paths for this layout."""
        if self.scheme == "puppet":
            assert self.ssl_dir is not None
            identity = self.identity or socket.getfqdn()
            base = Path(self.ssl_dir)
            return (
                str(base / "certs" / "ca.pem"),
                str(base / "certs" / f"{identity}.pem"),
                str(base / "private_keys" / f"{identity}.pem"),
            )
        return self.ca, self.cert, self.key


class AdvisoryConfig(Strict):
    """`target` may hold `%s` (the event) and `%v` (the sender's value), as the Go tool's subjects do."""

    target: str
    cluster: Literal["target", "source"] = "target"
    age: Duration | None = None
    format: Literal["v1", "v2"] = "v1"
    reliable: bool | None = None
    # `gap` advisories: ranges the source stream discarded before they were copied (`copier/loss.py`).
    gaps: bool = True

    @field_validator("target")
    @classmethod
    def _subject(cls, value: str) -> str:
        if not value or any(ch in value for ch in " \t*>"):
            raise ValueError(f"advisory subject {value!r} must be a literal subject")
        return value


class TopicConfig(Strict):
    """One replication profile."""

    topic: str
    source_url: str
    target_url: str
    source_stream: str | None = None
    target_stream: str | None = None
    target_subject_prefix: str | None = None
    target_subject_remove: str | None = None
    target_create: bool = True
    # Replicas of a target stream the replicator creates (None: the source's). NATS allows 1 to 5.
    target_replicas: int | None = Field(default=None, ge=1, le=5)
    # Limits of a target stream the replicator creates (None: no limit; the source's count and size
    # limits were sized for one source, and a target is often shared: `transport/streams.py`).
    target_max_msgs: int | None = Field(default=None, ge=1)
    target_max_bytes: int | None = Field(default=None, ge=1)
    target_max_age: Duration | None = None  # None: the source's max_age
    target_max_msgs_per_subject: int | None = Field(default=None, ge=1)
    target_discard: Literal["old", "new"] | None = None  # None: old (NATS's default)
    # Two sites replicating into each other on purpose: a delivered copy that would loop (`copier/loops.py`)
    # is skipped and counted instead of stopping the replicator.
    active_active: bool = False
    source_cluster_id: str | None = None
    target_cluster_id: str | None = None
    workers: int = Field(default=1, ge=1, le=1024)
    queued: bool = False
    queue_group: str | None = None
    name: str | None = None
    start_sequence: int | None = Field(default=None, ge=1)
    start_time: dt.datetime | None = None
    start_delta: Duration | None = None
    start_at_end: bool = False
    # Source sequences up to this one are on the target already, copied by another engine (the
    # operator's native engine): never start before it, even on a first start.
    resume_after: int | None = Field(default=None, ge=0)
    max_age: Duration | None = None
    inspect: str | None = None
    inspect_header: str | None = None
    inspect_subject_token: int | None = None
    age: Duration | None = None
    update_flag: str | None = None
    size_trigger: int | None = Field(default=None, ge=1)
    limiter_state: Literal["memory", "file", "kv"] = "memory"
    advisory: AdvisoryConfig | None = None
    dead_letter: str | None = None
    leader_election: bool = False
    leader_election_ttl: Duration = 10.0
    monitor: int | None = Field(default=None, ge=0, le=65535)
    source_credentials: str | None = None
    target_credentials: str | None = None
    source_jwt_file: str | None = None
    source_seed_file: str | None = None
    target_jwt_file: str | None = None
    target_seed_file: str | None = None
    # User/password authentication from two files (a mounted `kubernetes.io/basic-auth` Secret),
    # read again at every reconnect: the password stays out of the URL, the config and logs.
    source_user_file: str | None = None
    source_password_file: str | None = None
    target_user_file: str | None = None
    target_password_file: str | None = None
    # A bare nkey seed file (nkey authentication, no JWT) and a token file (token authentication):
    # read at every reconnect like the others, so neither needs to be written into a URL.
    source_nkey_file: str | None = None
    target_nkey_file: str | None = None
    source_token_file: str | None = None
    target_token_file: str | None = None
    durable: str | None = None
    ephemeral: bool = False
    leader_election_bucket: str | None = None
    tls: TLSConfig | None = None
    source_tls: TLSConfig | None = None
    target_tls: TLSConfig | None = None
    disable_source_tls: bool = False
    disable_target_tls: bool = False
    batch: int | None = Field(default=None, ge=1, le=10000)  # None: sized by message size (`Puller.size_for`)
    max_in_flight: int = Field(default=2000, ge=1, le=100000)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if not value or " " in value or ".." in value or value.startswith(".") or value.endswith("."):
            raise ValueError(f"invalid subject {value!r}")
        return value

    @field_validator("dead_letter")
    @classmethod
    def _dead_letter(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(ch in value for ch in " \t*>")):
            raise ValueError(f"dead_letter subject {value!r} must be a literal subject")
        return value

    @field_validator("inspect_subject_token")
    @classmethod
    def _token(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("must be -1 (the whole subject) or greater than 0 (a 1-based token)")
        return value

    @field_validator("source_url", "target_url")
    @classmethod
    def _urls(cls, value: str) -> str:
        return check_urls(value)

    @field_validator("source_stream", "target_stream", "queue_group", "name", "durable", "leader_election_bucket")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value or any(ch in value for ch in " \t.*>/\\"):
            raise ValueError(f"{value!r} is not a valid JetStream name (no spaces, '.', '*', '>', slashes)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TopicConfig:
        keys = [k for k in ("inspect", "inspect_header", "inspect_subject_token") if getattr(self, k)]
        if len(keys) > 1:
            raise ValueError(f"only one of inspect, inspect_header, inspect_subject_token may be set, not {keys}")
        starts = [
            k for k in ("start_sequence", "start_time", "start_delta", "start_at_end") if getattr(self, k)
        ]
        if len(starts) > 1:
            raise ValueError(f"only one start position may be set, not {starts}")
        if keys and not self.age:
            raise ValueError(f"{keys[0]} needs age (the sampling interval)")
        if (self.update_flag or self.size_trigger) and not keys:
            raise ValueError("update_flag and size_trigger need a sampling key (inspect, ...)")
        if self.advisory and not keys:
            raise ValueError("advisory needs a sampling key (inspect, inspect_header or inspect_subject_token)")
        if self.limiter_state == "kv" and not keys:
            raise ValueError("limiter_state 'kv' needs a sampling key")
        for key in ("durable", "ephemeral"):
            if getattr(self, key) and not self.ordered:
                raise ValueError(f"{key} is for ordered mode (one worker, not queued); scaled mode's consumer "
                                 "is queue_group")
        for side in ("source", "target"):
            check_auth({key: getattr(self, f"{side}_{key}") for key in AUTH_KEYS}, f"{side}_",
                       getattr(self, f"{side}_url"), side)
        return self

    @property
    def sampling(self) -> bool:
        return bool(self.inspect or self.inspect_header or self.inspect_subject_token)

    @property
    def ordered(self) -> bool:
        """One worker, not queued: order is kept; otherwise workers share a durable, unordered."""
        return self.workers == 1 and not self.queued

    @property
    def advisory_age(self) -> float | None:
        if not self.advisory:
            return None
        if self.advisory.age:
            return self.advisory.age
        return (self.age or 0) / 2 or None


class HeartbeatSubject(Strict):
    subject: str
    interval: Duration | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("subject")
    @classmethod
    def _literal(cls, value: str) -> str:
        if not value or any(ch in value for ch in " \t*>") or ".." in value or value[0] == "." or value[-1] == ".":
            raise ValueError(f"heartbeat subject {value!r} must be a literal subject")
        return value

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("interval must be positive")
        return value


class HeartbeatsConfig(Strict):
    """Periodic JetStream publishes (unix time as body) that keep idle streams measurably alive."""

    url: str
    interval: Duration = 10.0
    leader_election: bool = False
    leader_election_bucket: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    subjects: list[HeartbeatSubject] = Field(min_length=1)
    tls: TLSConfig | None = None
    credentials: str | None = None
    jwt_file: str | None = None
    seed_file: str | None = None
    user_file: str | None = None
    password_file: str | None = None
    nkey_file: str | None = None
    token_file: str | None = None

    @field_validator("url")
    @classmethod
    def _urls(cls, value: str) -> str:
        return check_urls(value)

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("interval must be positive")
        return value

    @model_validator(mode="after")
    def _auth(self) -> HeartbeatsConfig:
        check_auth({key: getattr(self, key) for key in AUTH_KEYS}, "", self.url, "heartbeat connection")
        return self


# A connection's credential keys (`source_` + key in a topic, bare in `heartbeats`).
AUTH_KEYS = ("credentials", "jwt_file", "seed_file", "user_file", "password_file", "nkey_file", "token_file")


def check_auth(value: Mapping[str, str | None], prefix: str, url: str, what: str) -> None:
    """A connection's credentials: the two-file pairs complete, and one way to authenticate at a
    time (a `.creds` file, a JWT with its seed, a user and password file, the URL's query options
    or its `user:password@` / `token@`). `value` maps `AUTH_KEYS` to the connection's settings,
    `prefix` is how its keys are spelt (`source_`)."""
    for first, second, meaning in (("jwt_file", "seed_file", "a user JWT and its nkey seed"),
                                   ("user_file", "password_file", "a user name and its password")):
        if bool(value[first]) != bool(value[second]):
            raise ValueError(f"{prefix}{first} and {prefix}{second} go together ({meaning})")
    opts = url_options(url)
    given = [f"{prefix}{k}" for k in ("credentials", "jwt_file", "user_file", "nkey_file", "token_file") if value[k]]
    given += [f"{prefix}url ?{k}=" for k in ("credentials", "jwt") if getattr(opts, k)]
    if opts.userinfo:
        given.append(f"{prefix}url {opts.userinfo}@")
    if len(given) > 1:
        raise ValueError(f"one way to authenticate the {what} at a time, not {given}")


@dataclass(frozen=True)
class GoIdentity:
    """Who a Go-format stream entry was: the names its headers, metrics and consumer carry, and
    where its keys were in the file (`keys`: model key -> the Go key it came from), for messages."""

    replicator: str
    name: str
    stream: str
    index: int
    keys: dict[str, str]
    election_name: str | None = None


class Config(Strict):
    debug: bool = False
    verbose: bool = False
    logfile: str | None = None
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warn", "warning", "error"] | None = None
    state_dir: str | None = None
    tls: TLSConfig | None = None
    name: str | None = None
    heartbeats: HeartbeatsConfig | None = None
    topics: dict[str, TopicConfig]
    # Set by the Go-format loader (profile -> its Go names); empty for a legacy file.
    _go: dict[str, GoIdentity] = PrivateAttr(default_factory=dict)
    # What loading had to warn about (keys accepted but ignored), for the caller to log once.
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)

    @property
    def dialect(self) -> Literal["legacy", "go"]:
        """Which file format this came from: a Go-format file gets the Go tool's observable surface."""
        return "go" if self._go else "legacy"

    @model_validator(mode="after")
    def _some_topics(self) -> Config:
        if not self.topics and self.heartbeats is None:
            raise ValueError("topics: at least one topic is required")
        return self

    @model_validator(mode="after")
    def _file_state(self) -> Config:
        for name, topic in self.topics.items():
            if topic.limiter_state == "file" and not self.state_dir:
                raise ValueError(f"topics.{name}.limiter_state 'file' needs state_dir")
        return self


class Profile:
    """A topic's settings resolved against the globals: names, TLS per side, state paths."""

    def __init__(self, config: Config, profile: str, *, instance: str | None = None, source: str = "") -> None:
        if profile not in config.topics:
            known = ", ".join(sorted(config.topics))
            raise ConfigError(f"{source}: no topic {profile!r} in topics (known: {known})")
        self.config = config
        self.profile = profile
        self.settings = config.topics[profile]
        self.instance = instance
        self.source = source

    # ---- naming (the legacy README's scheme) ----
    @property
    def base_name(self) -> str:
        s = self.settings
        if s.name:
            return s.name
        prefix = f"{s.source_cluster_id}_" if s.source_cluster_id else ""
        return f"{prefix}{self.profile}_{subject_token_name(s.topic)}_stream_replicator"

    @property
    def durable_name(self) -> str:
        """Ordered mode's durable consumer; stable across restarts and pods."""
        return self.settings.durable or self.base_name

    @property
    def group_name(self) -> str:
        """Scaled mode's shared durable (the legacy queue group)."""
        return self.settings.queue_group or f"{subject_token_name(self.settings.topic)}_stream_replicator_grp"

    @property
    def consumer_name(self) -> str:
        return self.durable_name if self.settings.ordered else self.group_name

    def worker_names(self) -> list[str]:
        """NATS connection names, unique per worker (and per pod when an instance id is given)."""
        base = self.base_name if not self.instance else f"{self.base_name}_{self.instance}"
        return [f"{base}_{i}" for i in range(self.settings.workers)]

    @property
    def metrics_name(self) -> str:
        return self.base_name

    @property
    def replicator(self) -> str:
        """The site name that v2 advisories, `Choria-SR-Source` and the Go-format metrics carry."""
        return self.config.name or self.metrics_name

    @property
    def go(self) -> GoIdentity | None:
        """The Go-format names of this profile, when it came from a Go-format file."""
        return self.config._go.get(self.profile)

    def key(self, name: str) -> str:
        """A key of this profile as the file spells it, for messages (`topics.cmdb.age`, `streams.0.x`)."""
        go = self.go
        if go is not None:
            return go.keys.get(name, f"streams.{go.index}.{name}")
        return f"topics.{self.profile}.{name}"

    # ---- TLS and credentials per side ----
    def url_options(self, side: Literal["source", "target"]) -> UrlOptions:
        """The side's servers and the options of their query string (`?credentials=...`)."""
        return url_options(self.settings.source_url if side == "source" else self.settings.target_url)

    def tls_for(self, side: Literal["source", "target"]) -> TLSConfig | None:
        s = self.settings
        if (side == "source" and s.disable_source_tls) or (side == "target" and s.disable_target_tls):
            return None
        specific = s.source_tls if side == "source" else s.target_tls
        return with_url_tls(specific or s.tls or self.config.tls, self.url_options(side))

    def credentials_for(self, side: Literal["source", "target"]) -> str | None:
        creds = self.settings.source_credentials if side == "source" else self.settings.target_credentials
        return creds or self.url_options(side).credentials

    def jwt_for(self, side: Literal["source", "target"]) -> tuple[str, str] | None:
        """(user JWT file, nkey seed file), from the profile or the URL's `?jwt=&nkey=`."""
        jwt, seed = getattr(self.settings, f"{side}_jwt_file"), getattr(self.settings, f"{side}_seed_file")
        if jwt and seed:
            return jwt, seed
        opts = self.url_options(side)
        return (opts.jwt, opts.nkey) if opts.jwt and opts.nkey else None

    def basic_auth_for(self, side: Literal["source", "target"]) -> tuple[str, str] | None:
        """(user name file, password file) of a side, when it authenticates with them."""
        user, password = getattr(self.settings, f"{side}_user_file"), getattr(self.settings, f"{side}_password_file")
        return (user, password) if user and password else None

    def nkey_for(self, side: Literal["source", "target"]) -> str | None:
        """A bare nkey seed file of a side (nkey authentication, no JWT)."""
        return getattr(self.settings, f"{side}_nkey_file")  # type: ignore[no-any-return]

    def token_for(self, side: Literal["source", "target"]) -> str | None:
        """A token file of a side (token authentication, the token never in a URL)."""
        return getattr(self.settings, f"{side}_token_file")  # type: ignore[no-any-return]

    def connect_timeout_for(self, side: Literal["source", "target"]) -> float | None:
        return self.url_options(side).connect_timeout

    def check_files(self) -> None:
        """Unreadable TLS and credentials files fail at start, not at the first reconnect.

        Only the profile being run is checked, so one config can describe hosts with other files.
        """
        for side in ("source", "target"):
            tls = self.tls_for(side)  # type: ignore[arg-type]
            if tls:
                key = (self.key(f"{side}_tls") if getattr(self.settings, f"{side}_tls")
                       else self.key("tls") if self.settings.tls else "tls")
                for label, path in zip(("ca", "cert", "key"), tls.files(), strict=True):
                    if path and not os.access(path, os.R_OK):
                        raise ConfigError(f"{self.source}: {key}: {side} TLS {label} file {path} is not readable")
            creds = self.credentials_for(side)  # type: ignore[arg-type]
            if creds and not os.access(creds, os.R_OK):
                key = self.key(f"{side}_credentials" if getattr(self.settings, f"{side}_credentials")
                               else f"{side}_url")
                raise ConfigError(f"{self.source}: {key}: file {creds} is not readable")
            jwt = self.jwt_for(side)  # type: ignore[arg-type]
            for label, path in zip(("jwt_file", "seed_file"), jwt or (), strict=False):
                if not os.access(path, os.R_OK):
                    key = self.key(f"{side}_{label}" if getattr(self.settings, f"{side}_{label}") else f"{side}_url")
                    raise ConfigError(f"{self.source}: {key}: file {path} is not readable")
            basic = self.basic_auth_for(side)  # type: ignore[arg-type]
            for label, path in zip(("user_file", "password_file"), basic or (), strict=False):
                if not os.access(path, os.R_OK):
                    raise ConfigError(f"{self.source}: {self.key(f'{side}_{label}')}: file {path} is not readable")
            for label in ("nkey_file", "token_file"):
                path = getattr(self.settings, f"{side}_{label}")
                if path and not os.access(path, os.R_OK):
                    raise ConfigError(f"{self.source}: {self.key(f'{side}_{label}')}: file {path} is not readable")

    def state_file(self) -> Path:
        assert self.config.state_dir
        return Path(self.config.state_dir) / f"{self.profile}.json"


def check_urls(value: str) -> str:
    """A comma-separated NATS URL list, each with scheme, host and numeric port, query options known."""
    urls = split_urls(value)
    if not urls:
        raise ValueError("at least one NATS URL is required")
    for url in urls:
        try:
            parts = urlsplit(url)
            port = parts.port  # raises ValueError when it is not a number
        except ValueError:
            parts, port = None, None
        if (parts is None or parts.scheme not in {"nats", "tls", "ws", "wss"} or not parts.hostname
                or (port is None and ":" in parts.netloc.rsplit("@", 1)[-1]) or " " in url):
            raise ValueError(f"invalid NATS URL {redact_url(url)!r} (want nats://host:port)")
    url_options(value)  # raises for unknown or broken query options
    return ",".join(urls)


def with_url_tls(tls: TLSConfig | None, opts: UrlOptions) -> TLSConfig | None:
    """`?insecure=true` and `?tls_handshake_first=true` turn TLS on (as they do in the Go tool)."""
    if not (opts.insecure or opts.tls_handshake_first):
        return tls
    extra = {"insecure": opts.insecure or bool(tls and tls.insecure),
             "handshake_first": opts.tls_handshake_first or bool(tls and tls.handshake_first)}
    return tls.model_copy(update=extra) if tls else TLSConfig(insecure=extra["insecure"],
                                                              handshake_first=extra["handshake_first"])


def subject_token_name(subject: str) -> str:
    """A subject as a name fragment: `acme.cmdb` -> `acme_cmdb`; wildcards spelled out."""
    return subject.replace(".", "_").replace("*", "any").replace(">", "all")


def redact_url(url: str) -> str:
    """Hide user:password, tokens and query secrets before a URL reaches logs or errors."""
    url = re.sub(r"//.*@", "//***@", url)  # greedy: a password may hold an unencoded '@' or '/'

    return re.sub(r"\?.*$", "?***", url)
