"""Source and target streams: find the source, create the target from the source's config."""

from __future__ import annotations

import logging
from dataclasses import replace

from nats.js.api import StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

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
