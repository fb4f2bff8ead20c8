"""Source and target streams: find the source, create the target from the source's config (its
limits made safe for fan-in), read a stream's creation time, and note a consumer's state in its
metadata."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from nats.aio.client import Client
from nats.js.api import ConsumerInfo, DiscardPolicy, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from replicator.config.model import TopicConfig
from replicator.transport.subjects import SubjectRewriter

log = logging.getLogger(__name__)


class StreamSetupError(Exception):
    """A stream is missing or unusable; the message says which and why."""


async def find_source_stream(js: JetStreamContext, settings: TopicConfig) -> str:
    if settings.source_stream:
        try:
            await js.stream_info(settings.source_stream)
        except NotFoundError:
            raise StreamSetupError(f"source stream {settings.source_stream!r} does not exist") from None
        return settings.source_stream
    try:
        return await js.find_stream_name_by_subject(settings.topic)
    except NotFoundError:
        raise StreamSetupError(f"no source stream captures subject {settings.topic!r}") from None


async def ensure_target_stream(
    source_js: JetStreamContext, target_js: JetStreamContext, settings: TopicConfig, source_stream: str
) -> str:
    """The target stream, created from the source's config with subjects rewritten unless told not to;
    with `target_replicas` replicas, else the source's (one on a standalone server)."""
    name = settings.target_stream or source_stream
    rewrite = SubjectRewriter(settings)
    try:
        info = await target_js.stream_info(name)
        wanted, has = settings.target_replicas, info.config.num_replicas or 1
        if wanted and wanted != has:
            log.warning("target stream %s has %d replicas, not the %d of target_replicas: left as it is (the "
                        "replicator creates streams, never changes them)", name, has, wanted)
        await _check_existing(source_js, source_stream, name, info.config, settings)
        return name
    except NotFoundError:
        if not settings.target_create:
            # Not ours to create: whichever stream captures the copies will do (the Go tool's
            # `no_target_create` never names one).
            subject = rewrite(settings.topic)
            try:
                return await target_js.find_stream_name_by_subject(subject)
            except NotFoundError:
                raise StreamSetupError(f"target stream {name!r} does not exist, no target stream captures "
                                       f"{subject!r}, and target_create is false") from None
    source_cfg = (await source_js.stream_info(source_stream)).config
    subjects = [rewrite(s) for s in (source_cfg.subjects or [settings.topic])]
    cfg = replace(
        source_cfg,
        name=name,
        subjects=subjects,
        mirror=None,
        sources=None,
        sealed=False,
        subject_transform=None,
        republish=None,
        placement=None,
        description=f"replicated from {source_stream} by stream-replicator",
        # Lets the ordered copier write in fast-ingest batches (copier/batching.py); 2.14+ only.
        allow_batched=True if batches_supported(target_js) else source_cfg.allow_batched,
        num_replicas=settings.target_replicas or source_cfg.num_replicas,
    )
    limits, left = fan_in_limits(_limits_of(source_cfg), wanted_limits(settings))
    cfg = replace(cfg, **{**limits, "discard": DiscardPolicy(limits["discard"])})
    cfg = _drop_unset(cfg)
    try:
        await target_js.add_stream(cfg)
    except APIError as err:
        # A replicated source (a city's R3 cluster) copied to a standalone server: the source's
        # replicas cannot be had there, and refusing to copy at all would help nobody.
        if err.err_code != REPLICAS_NOT_CLUSTERED or (cfg.num_replicas or 1) <= 1:
            raise
        if settings.target_replicas:
            raise StreamSetupError(f"target stream {name!r}: target_replicas is {settings.target_replicas}, but the "
                                   "target server is not clustered: it keeps one replica only (set target_replicas "
                                   "to 1, or leave it unset)") from None
        log.warning("target server is not clustered: creating target stream %s with 1 replica instead of the "
                    "source's %d", name, cfg.num_replicas)
        cfg = replace(cfg, num_replicas=1)
        await target_js.add_stream(cfg)
    log.info("created target stream %s with subjects %s (%d replicas): took the source's storage %s, retention %s "
             "and max_age %s; limits %s%s", name, subjects, cfg.num_replicas or 1, _value(source_cfg.storage),
             _value(source_cfg.retention), _seconds(source_cfg.max_age), describe_limits(limits),
             f"; not the source's {', '.join(left)}, sized for one source (target_max_msgs, target_max_bytes, "
             "target_max_msgs_per_subject set the target's)" if left else "")
    return name


# ---- fan-in-safe limits: a target is often shared by many sources ----
SIZED_FOR_ONE = ("max_msgs", "max_bytes", "max_msgs_per_subject", "max_msg_size")
LIMITS = ("max_msgs", "max_bytes", "max_msgs_per_subject", "max_age")


def wanted_limits(settings: TopicConfig) -> dict[str, Any]:
    """The `target_*` limit keys (None: not set), in the stream config's terms (max_age in seconds)."""
    return {"max_msgs": settings.target_max_msgs, "max_bytes": settings.target_max_bytes,
            "max_msgs_per_subject": settings.target_max_msgs_per_subject, "max_age": settings.target_max_age,
            "discard": settings.target_discard}


def fan_in_limits(source: Mapping[str, Any], wanted: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A created target's limits, and the source's limits it did not take. The source's count and
    size limits were sized for one source, and a region stream created by the first city's
    replicator would apply them to every city's copies: only the wanted ones are set. `max_age`
    (the data's lifetime, not its volume) is the source's unless wanted; discard is `old` unless
    wanted. `source` and `wanted` in the same units (max_age: seconds here, nanoseconds in the
    server's JSON)."""
    limits: dict[str, Any] = {k: wanted.get(k) or -1 for k in SIZED_FOR_ONE}
    limits["max_age"] = wanted["max_age"] if wanted.get("max_age") is not None else source.get("max_age") or 0
    limits["discard"] = wanted.get("discard") or "old"
    limits["discard_new_per_subject"] = False
    left = [f"{k} {source[k]}" for k in SIZED_FOR_ONE if (source.get(k) or 0) > 0 and limits[k] != source[k]]
    return limits, left


def tighter_limits(target: Mapping[str, Any], source: Mapping[str, Any]) -> list[str]:
    """The target's limits under the source's (or where the source has none): the target discards
    copies (or, with discard new, refuses them) before the source lets the messages go."""
    found = []
    for key in LIMITS:
        has, src = target.get(key) or 0, source.get(key) or 0
        if has > 0 and (src <= 0 or has < src):
            found.append(f"{key} {has} (the source's: {src if src > 0 else 'none'})")
    return found


def describe_limits(limits: Mapping[str, Any]) -> str:
    set_ = [f"{k} {limits[k]}" for k in LIMITS if k != "max_age" and (limits.get(k) or 0) > 0]
    return (", ".join(set_) or "none on count or size") + f", discard {limits.get('discard') or 'old'}"


async def _check_existing(source_js: JetStreamContext, source_stream: str, name: str, target: StreamConfig,
                          settings: TopicConfig) -> None:
    """Warn about an existing target that would lose copies sooner than the source loses the
    messages, and about `target_*` limits it does not have (never changed)."""
    try:
        source_cfg = (await source_js.stream_info(source_stream)).config
    except (APIError, NotFoundError):
        return  # the source is found again, and reported, by whoever needs it
    tighter = tighter_limits(_limits_of(target), _limits_of(source_cfg))
    if tighter:
        log.warning("target stream %s has tighter limits than source stream %s: %s; with discard %s it %s copies "
                    "that the source still holds (and it may be shared by more sources): raise them with nats "
                    "stream edit", name, source_stream, ", ".join(tighter), _value(target.discard) or "old",
                    "refuses" if _value(target.discard) == "new" else "discards")
    has = _limits_of(target)
    differ = [f"target_{k} {v} (the stream's: {has.get(k)})" for k, v in wanted_limits(settings).items()
              if v is not None and k != "discard" and v != has.get(k)]
    if settings.target_discard and settings.target_discard != _value(target.discard):
        differ.append(f"target_discard {settings.target_discard} (the stream's: {_value(target.discard)})")
    if differ:
        log.warning("target stream %s exists: %s left as it is (the replicator creates streams, never changes them)",
                    name, ", ".join(differ))


def _limits_of(cfg: StreamConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in (*SIZED_FOR_ONE, "max_age")}


def _value(value: object) -> str:
    return str(getattr(value, "value", value) or "")


def _seconds(value: float | None) -> str:
    return f"{value:g}s" if value else "none"


REPLICAS_NOT_CLUSTERED = 10074  # "replicas > 1 not supported in non-clustered mode"


def batches_supported(js: JetStreamContext) -> bool:
    """Does the server behind `js` know fast-ingest batch publishing (2.14+)?"""
    try:
        version = js._nc.connected_server_version
        return (version.major, version.minor) >= (2, 14)
    except (AttributeError, ValueError):  # no server info yet, or a version nats-py cannot read
        return False


def _drop_unset(cfg: StreamConfig) -> StreamConfig:
    """Copying a live config carries server-assigned fields that a create request must not send."""
    if cfg.metadata:
        cfg = replace(cfg, metadata={k: v for k, v in cfg.metadata.items() if not k.startswith("_nats")})
    return cfg


async def stream_created(nc: Client, stream: str, api_prefix: str = "$JS.API", timeout: float = 5.0) -> str:
    """The stream's `created` time exactly as the server sends it (nanoseconds, UTC), which tells a
    re-created stream from its former self; nats-py's StreamInfo keeps only microseconds."""
    reply = await nc.request(f"{api_prefix}.STREAM.INFO.{stream}", b"", timeout=timeout)
    body = json.loads(reply.data)
    if "error" in body:
        err = body["error"]
        if err.get("err_code") == 10059:
            raise StreamSetupError(f"stream {stream!r} does not exist")
        raise StreamSetupError(f"stream {stream!r}: {err.get('description', err)}")
    created = str(body["created"])
    if not created.endswith("Z"):  # a non-UTC offset: normalise as the server's identity does (UTC)
        head, _, frac = created.partition(".")
        digits = "".join(ch for ch in frac if ch.isdigit())
        offset = frac[len(digits):]
        when = dt.datetime.fromisoformat(head + offset).astimezone(dt.UTC)
        created = when.strftime("%Y-%m-%dT%H:%M:%S") + (f".{digits.rstrip('0')}" if digits.strip("0") else "") + "Z"
    return created


def ack_floor(info: ConsumerInfo) -> int:
    """The stream sequence up to which a consumer's deliveries are all acknowledged (0: none yet)."""
    return info.ack_floor.stream_seq or 0 if info.ack_floor else 0


async def set_consumer_note(js: JetStreamContext, stream: str, consumer: str, key: str, value: str | None) -> None:
    """Set (or with None remove) one metadata entry of an existing consumer, the rest unchanged:
    state that `stream-replicator report` and `nats consumer info` can show from anywhere."""
    config = (await js.consumer_info(stream, consumer)).config
    metadata = {k: v for k, v in (config.metadata or {}).items() if not k.startswith("_nats")}
    if value is None and key not in metadata:
        return
    if value is None:
        metadata.pop(key)
    else:
        metadata[key] = value
    await js.add_consumer(stream, replace(config, metadata=metadata))
