"""The native engine's source entry: what the operator writes into the target stream, pure.

A StreamReplication run natively is one entry in the target stream's `sources` list; NATS then copies
the messages itself. Everything here works on the server's own JSON (`$JS.API.STREAM.INFO`), so a
field this code does not know, in the stream or in another source entry, passes through untouched.

Which entry is ours: the one that reads the same source stream through the same API prefix with
the same filter subjects, the triple by which NATS itself tells sources apart (besides the
transform's destination, which we own and repair). The operator records the triple it wrote in the
resource's status, so an entry written for an earlier spec (another topic) is still recognised.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replication_operator.model.spec import ReplicationSpec

from replicator.config.durations import parse_duration
from replicator.transport.streams import fan_in_limits
from replicator.transport.subjects import rewrite_subject

SOURCE_HEADER = "Nats-Stream-Source"  # set by the server on every sourced message
ALL = ">"
# The server's short hash of an API prefix (part of a sourced message's header): 8 characters
# from the first 8 bytes of its SHA-256, each taken modulo 62 into this alphabet.
_HASH_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

@dataclass(frozen=True)
class Route:
    """How the target reaches the source's JetStream API."""

    api: str  # the API prefix the target's server uses, e.g. `$JS.leaf.API`
    deliver: str | None
    via: str  # for messages


Identity = tuple[str, str, tuple[str, ...]]  # (source stream, API prefix or "", filter subjects)


def api_hash(prefix: str) -> str:
    digest = hashlib.sha256(prefix.encode()).digest()
    return "".join(_HASH_DIGITS[digest[i] % len(_HASH_DIGITS)] for i in range(8))


# ---- subjects ----
def _is_wildcard(token: str) -> bool:
    return token in ("*", ">")


def subject_mapping(spec: ReplicationSpec) -> tuple[str, str] | None:
    """(filter, destination) of the entry: the topic and the subject the replicator would write,
    as a NATS subject transform; None when no transform means the same thing.

    A prefix maps token for token. `subjectRemove` removes text anywhere in a concrete subject (in
    a token a wildcard matched, too), so it only has a transform when the topic has no wildcard.
    """
    topic = spec.topic
    prefix, remove = spec.target.subject_prefix, spec.target.subject_remove
    wildcards = any(_is_wildcard(t) for t in topic.split("."))
    if remove and wildcards:
        return None
    dest = rewrite_subject(topic, prefix, remove)
    if not dest or [t for t in dest.split(".") if _is_wildcard(t)] != [t for t in topic.split(".") if _is_wildcard(t)]:
        return None  # a removal that ate a token boundary or a wildcard
    return topic, dest


def transform_destination(dest: str) -> str:
    """The destination in subject-transform syntax: the n-th `*` becomes `{{wildcard(n)}}`."""
    out, n = [], 0
    for token in dest.split("."):
        if token == "*":
            n += 1
            out.append(f"{{{{wildcard({n})}}}}")
        else:
            out.append(token)
    return ".".join(out)


# ---- the entry ----
@dataclass(frozen=True)
class Start:
    """Where the entry starts reading when NATS has no position of its own for it yet."""

    sequence: int | None = None
    time: str | None = None  # RFC 3339

    def fields(self) -> dict[str, Any]:
        if self.time:
            return {"opt_start_time": self.time}
        return {"opt_start_seq": max(1, self.sequence or 1)}

    def status(self) -> dict[str, Any]:
        return {"time": self.time} if self.time else {"sequence": max(1, self.sequence or 1)}

    @classmethod
    def from_status(cls, value: Mapping[str, Any] | None) -> Start | None:
        if not value:
            return None
        if value.get("time"):
            return cls(time=str(value["time"]))
        return cls(sequence=int(value.get("sequence") or 1))


def spec_start(spec: ReplicationSpec, now: dt.datetime, source_last_seq: int) -> Start:
    """`spec.start` resolved once, when the entry is first written (the operator records it):
    `delta` becomes a time, `atEnd` the sequence after the source's last."""
    start = spec.start
    if start is not None and start.sequence is not None:
        return Start(sequence=start.sequence)
    if start is not None and start.time is not None:
        return Start(time=_rfc3339(dt.datetime.fromisoformat(start.time.replace("Z", "+00:00"))))
    if start is not None and start.delta is not None:
        return Start(time=_rfc3339(now - dt.timedelta(seconds=parse_duration(start.delta))))
    if start is not None and start.at_end:
        return Start(sequence=source_last_seq + 1)
    return Start(sequence=1)  # explicit: without it the server may start at the target's last time


def _rfc3339(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_entry(spec: ReplicationSpec, route: Route, source_stream: str, start: Start) -> dict[str, Any]:
    """The `sources` entry, in the server's JSON."""
    mapping = subject_mapping(spec)
    if mapping is None:
        raise ValueError("the subject rewrite has no NATS subject transform")
    topic, dest = mapping
    entry: dict[str, Any] = {"name": source_stream, **start.fields()}
    if dest == topic:
        entry["filter_subject"] = topic
    else:
        entry["subject_transforms"] = [{"src": topic, "dest": transform_destination(dest)}]
    if route.api:
        external = {"api": route.api}
        if route.deliver:
            external["deliver"] = route.deliver
        entry["external"] = external
    return entry


def filters(entry: Mapping[str, Any]) -> tuple[str, ...]:
    transforms = entry.get("subject_transforms") or []
    if transforms:
        return tuple(str(t.get("src") or ALL) for t in transforms)
    return (str(entry.get("filter_subject") or ALL),)


def destinations(entry: Mapping[str, Any]) -> tuple[str, ...]:
    transforms = entry.get("subject_transforms") or []
    if transforms:
        return tuple(str(t.get("dest") or ALL) for t in transforms)
    return (ALL,)


def identity(entry: Mapping[str, Any]) -> Identity:
    external = entry.get("external") or {}
    return str(entry.get("name") or ""), str(external.get("api") or ""), filters(entry)


def identity_status(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The identity as recorded in status.native."""
    name, api, subjects = identity(entry)
    recorded: dict[str, Any] = {"sourceStream": name, "filterSubjects": list(subjects)}
    if api:
        recorded["apiPrefix"] = api
    return recorded


def identity_from_status(native: Mapping[str, Any] | None) -> Identity | None:
    if not native or not native.get("sourceStream"):
        return None
    return (str(native["sourceStream"]), str(native.get("apiPrefix") or ""),
            tuple(str(s) for s in native.get("filterSubjects") or [ALL]))


def recorded_entry(native: Mapping[str, Any]) -> dict[str, Any]:
    """The entry status.native describes (without its start): enough to recognise its copies."""
    subjects = tuple(native.get("filterSubjects") or [ALL])
    dests = tuple(native.get("destinations") or [ALL])
    entry: dict[str, Any] = {"name": native.get("sourceStream")}
    if len(dests) == len(subjects) and dests != (ALL,):
        entry["subject_transforms"] = [{"src": s, "dest": d} for s, d in zip(subjects, dests, strict=True)]
    else:
        entry["filter_subject"] = subjects[0]
    if native.get("apiPrefix"):
        entry["external"] = {"api": native["apiPrefix"]}
    return entry


def moved(recorded: Mapping[str, Any], desired: Mapping[str, Any], stream: str) -> bool:
    """Whether the spec moved the entry (another target stream, source, API prefix, filter or
    destination): NATS would take the new one for a new source and start it afresh."""
    if not recorded.get("sourceStream"):
        return False
    return recorded.get("stream") != stream or header_key(recorded_entry(recorded)) != header_key(desired)


OWNED_FIELDS = ("filter_subject", "subject_transforms", "external")


def same_entry(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the live entry says what we want. The start fields only matter before NATS has a
    position of its own; once written they are left as they are (changing them restarts nothing)."""
    def norm(entry: Mapping[str, Any], key: str) -> Any:
        value = entry.get(key)
        if key == "external" and value:
            return {"api": value.get("api") or "", "deliver": value.get("deliver") or ""}
        return value or None

    return all(norm(live, k) == norm(desired, k) for k in OWNED_FIELDS)


def with_entry(sources: Sequence[Mapping[str, Any]] | None, desired: Mapping[str, Any],
               owned: Iterable[Identity]) -> list[dict[str, Any]] | None:
    """The sources list with our entry in place of the ones we own (others untouched, in their
    order); None when nothing needs to change."""
    owned = {identity(desired), *owned}
    current = [dict(s) for s in sources or []]
    ours = [i for i, s in enumerate(current) if identity(s) in owned]
    if len(ours) == 1 and identity(current[ours[0]]) == identity(desired) and same_entry(current[ours[0]], desired):
        return None
    if not ours:
        return [*current, dict(desired)]
    result = []
    for i, source in enumerate(current):
        if i == ours[0]:
            keep = {k: v for k, v in source.items() if k.startswith("opt_start")}
            same = identity(source) == identity(desired)
            result.append({**dict(desired), **keep} if same else dict(desired))
        elif i not in ours:
            result.append(source)
    return result


def without_entry(sources: Sequence[Mapping[str, Any]] | None,
                  owned: Iterable[Identity]) -> list[dict[str, Any]] | None:
    """The sources list without our entries; None when there is none."""
    owned = set(owned)
    current = [dict(s) for s in sources or []]
    kept = [s for s in current if identity(s) not in owned]
    return None if len(kept) == len(current) else kept


def find_entry(sources: Sequence[Mapping[str, Any]] | None, wanted: Identity) -> dict[str, Any] | None:
    return next((dict(s) for s in sources or [] if identity(s) == wanted), None)


# ---- what NATS tells about it ----
def header_key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    """(stream part, filter, destination) as the server writes them in `Nats-Stream-Source`."""
    external = entry.get("external") or {}
    name = str(entry.get("name") or "")
    if external.get("api"):
        name = f"{name}:{api_hash(str(external['api']))}"
    return name, "\f".join(filters(entry)), "\f".join(destinations(entry))


def delivered_sequence(header: str | None, entry: Mapping[str, Any]) -> int | None:
    """The source sequence a sourced message came from, if the entry delivered it (the header is
    `<stream>[:<api hash>] <sequence> <filter> <destination> <subject> [<identity>]`)."""
    if not header:
        return None
    fields = header.split(" ")
    if len(fields) < 4:
        return None
    name, filt, dest = header_key(entry)
    if (fields[0], fields[2], fields[3]) != (name, filt, dest):
        return None
    try:
        return int(fields[1])
    except ValueError:
        return None


def source_info(stream_info: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """Our entry's state in the target stream's info (`sources[]`, matched by identity)."""
    wanted = identity(entry)
    for info in stream_info.get("sources") or []:
        transforms = info.get("subject_transforms") or []
        subjects = tuple(str(t.get("src") or ALL) for t in transforms) if transforms else (
            str(info.get("filter_subject") or ALL),)
        api = str((info.get("external") or {}).get("api") or "")
        if (str(info.get("name") or ""), api, subjects) == wanted:
            return dict(info)
    return None


# ---- a target stream to create ----
CLEARED = ("mirror", "sources", "subject_transform", "republish", "placement")


def native_limits(source_config: Mapping[str, Any], spec: ReplicationSpec) -> dict[str, Any]:
    """The fan-in-safe limits of `transport/streams.py` in the server's JSON (max_age in nanoseconds)."""
    t = spec.target
    wanted = {"max_msgs": t.max_msgs, "max_bytes": t.max_bytes, "max_msgs_per_subject": t.max_msgs_per_subject,
              "max_age": int(parse_duration(t.max_age) * 1e9) if t.max_age is not None else None,
              "discard": t.discard}
    limits, _left = fan_in_limits(source_config, wanted)
    return limits


def target_config(source_config: Mapping[str, Any], spec: ReplicationSpec, name: str,
                  entry: Mapping[str, Any], source_stream: str) -> dict[str, Any]:
    """The replicator's `target_create` rules: the source's config with subjects rewritten and
    mirrors, sources, transforms, republish and placement dropped; plus our entry."""
    config = {k: v for k, v in source_config.items() if k not in CLEARED}
    subjects = source_config.get("subjects") or [spec.topic]
    rewritten = [rewrite_subject(s, spec.target.subject_prefix, spec.target.subject_remove) for s in subjects]
    config.update(
        name=name,
        subjects=list(dict.fromkeys(rewritten)),
        sources=[dict(entry)],
        sealed=False,
        mirror_direct=False,
        description=f"sourced from {source_stream} by stream-replicator (native engine)",
    )
    if spec.target.replicas:
        config["num_replicas"] = spec.target.replicas
    config.update(native_limits(source_config, spec))
    metadata = {k: v for k, v in (source_config.get("metadata") or {}).items() if not str(k).startswith("_nats")}
    if metadata:
        config["metadata"] = metadata
    else:
        config.pop("metadata", None)
    return config
