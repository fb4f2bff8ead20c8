"""Source and target streams: lookup, target creation, subject rewrite and the provenance header."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from nats.js.api import StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from replicator.config import TopicConfig

log = logging.getLogger(__name__)

PROVENANCE = "Stream-Replicator-Source"
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"


class StreamSetupError(Exception):
    """A stream is missing or unusable; the message says which and why."""


def provenance(source_stream: str, seq: int, name: str, timestamp_ns: int) -> str:
    return f"{source_stream} {seq} {name} {timestamp_ns // 1_000_000}"


@dataclass(frozen=True)
class Provenance:
    stream: str
    seq: int
    name: str
    timestamp_ms: int


def parse_provenance(value: str | None) -> Provenance | None:
    if not value:
        return None
    parts = value.split(" ")
    if len(parts) != 4:
        return None
    try:
        return Provenance(parts[0], int(parts[1]), parts[2], int(parts[3]))
    except ValueError:
        return None


def rewrite_subject(subject: str, prefix: str | None, remove: str | None) -> str:
    """Prefix first, then remove a substring, then tidy the dots (as the legacy tool does)."""
    if prefix:
        subject = f"{prefix}.{subject}"
    if remove:
        subject = subject.replace(remove, "")
    while ".." in subject:
        subject = subject.replace("..", ".")
    return subject.strip(".")


class SubjectRewriter:
    """Caches rewrites: a fleet's subjects repeat, the rewrite need not."""

    def __init__(self, settings: TopicConfig) -> None:
        self.prefix = settings.target_subject_prefix
        self.remove = settings.target_subject_remove
        self.identity = not self.prefix and not self.remove
        self._cache: dict[str, str] = {}

    def __call__(self, subject: str) -> str:
        if self.identity:
            return subject
        out = self._cache.get(subject)
        if out is None:
            out = rewrite_subject(subject, self.prefix, self.remove)
            if len(self._cache) < 100_000:
                self._cache[subject] = out
        return out


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
    """The target stream, created from the source's config with subjects rewritten unless told not to."""
    name = settings.target_stream or source_stream
    try:
        await target_js.stream_info(name)
        return name
    except NotFoundError:
        if not settings.target_create:
            raise StreamSetupError(f"target stream {name!r} does not exist and target_create is false") from None
    source_cfg = (await source_js.stream_info(source_stream)).config
    rewrite = SubjectRewriter(settings)
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
    )
    cfg = _drop_unset(cfg)
    await target_js.add_stream(cfg)
    log.info("created target stream %s with subjects %s", name, subjects)
    return name


def _drop_unset(cfg: StreamConfig) -> StreamConfig:
    """Copying a live config carries server-assigned fields that a create request must not send."""
    if cfg.metadata:
        cfg = replace(cfg, metadata={k: v for k, v in cfg.metadata.items() if not k.startswith("_nats")})
    return cfg


async def last_copied(
    target_js: JetStreamContext, target_stream: str, last_subject: str, source_stream: str, name: str
) -> int:
    """The last source sequence this replicator landed on the target (0 if none is found)."""
    try:
        msg = await target_js.get_last_msg(target_stream, last_subject)
    except NotFoundError:
        return 0
    prov = parse_provenance((msg.headers or {}).get(PROVENANCE))
    if prov is None or prov.stream != source_stream or prov.name != name:
        return 0
    return prov.seq
