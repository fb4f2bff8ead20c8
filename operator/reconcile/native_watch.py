"""The native engine's periodic look at its entry beyond what NATS reports: where the target is
(the last source sequence delivered) and where the source is (read from its own servers).

NATS's own lag for a source entry is its consumer's pending count, and it freezes while the link is
down; the source's last sequence read directly keeps counting, so the lag the operator reports and
exports rises while the link is cut and falls once NATS catches up.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replication_operator.checks.secrets import Secrets
from replication_operator.engine import entry as native
from replication_operator.engine import health, mirror
from replication_operator.engine.health import SourceHealth
from replication_operator.engine.target import TargetSession, parse_headers, target_subject
from replication_operator.model.spec import ReplicationSpec
from replication_operator.nats import probes
from replication_operator.nats.connection import NatsStatusError


async def _last(target: TargetSession, recorded: Mapping[str, Any]) -> dict[str, Any] | None:
    filters = tuple(recorded.get("filterSubjects") or [native.ALL])
    destinations = tuple(recorded.get("destinations") or [native.ALL])
    return await target.message(str(recorded.get("stream")), {"last_by_subj": target_subject(destinations, filters)})


async def last_sequence(target: TargetSession, stream: str, subject: str) -> int | None:
    """The stream sequence of the last message on `subject` (a mirror's copy: its source's sequence)."""
    last = await target.message(stream, {"last_by_subj": subject})
    return int(last["seq"]) if last and last.get("seq") else None


async def delivered(target: TargetSession, recorded: Mapping[str, Any]) -> int | None:
    """The source sequence of the last message on the entry's subjects, when our entry wrote it."""
    last = await _last(target, recorded)
    if not last or not last.get("hdrs"):
        return None
    headers = parse_headers(base64.b64decode(last["hdrs"]))
    return native.delivered_sequence(headers.get(native.SOURCE_HEADER), native.recorded_entry(recorded))


@dataclass(frozen=True)
class Measure:
    """One look at both ends: NATS's view with the lag from both ends (`seen`), the source stream
    as its own servers report it (`state`, None when they cannot be read)."""

    seen: SourceHealth
    state: probes.SourceState | None


async def measure(spec: ReplicationSpec, secrets: Secrets, target: TargetSession, recorded: Mapping[str, Any],
                  info: Mapping[str, Any], entry: Mapping[str, Any], time_limit: float) -> Measure:
    """NATS's view of the entry (`info`: the target stream's), with the lag counted from both ends
    when the source answers. A mirror keeps the source's sequences: its last is the last delivered."""
    if mirror.is_mirror(recorded):
        seen = health.source_health(info.get("mirror"))
        last = int((info.get("state") or {}).get("last_seq") or 0) or None
    else:
        seen = health.source_health(native.source_info(info, entry))
        last = await delivered(target, recorded)
    source_last, state = None, None
    try:
        auth = await secrets.auth(spec, spec.source)
        state = await probes.read_source_stream(spec, str(recorded.get("sourceStream")), auth, time_limit)
        if health.covers(spec.topic, state.subjects):
            source_last = state.last_seq
    except NatsStatusError:
        pass  # the source's own servers are out of reach: NATS's lag is all there is
    return Measure(health.measured(seen, last, source_last), state)
