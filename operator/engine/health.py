"""Whether a native entry is healthy (pure): from what the target stream says about it and from the
operator's own measures of the two ends.

NATS keeps copying without pods, so the native engine's readiness cannot come from a replica count.
Nor can it come from NATS alone: while the link to the source is down, the entry's `lag` freezes
and its `active` keeps reporting the server's retries (measured on 2.15: under a second, link cut
or not). So the operator counts the lag from both ends (the source's last sequence read from its
own servers, the last one delivered read on the target) and tracks when the entry last made
progress: caught up, or its delivered sequence moved. Ready: NATS reports no error, the entry
moved or was caught up within `spec.native.maxInactive`, and the lag is within `spec.native.maxLag`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from replication_operator.model.native import NativeSettings

from replicator.config.durations import parse_duration

# Ready False reasons of a configured entry (model/status.py has the others).
SOURCE_INACTIVE = "SourceInactive"  # messages wait and none arrived for maxInactive (Degraded)
CONNECTING = "SourceConnecting"  # NATS has not reached the source yet
LAGGING = "Lagging"  # more than maxLag messages behind (not Degraded: NATS still copies)


@dataclass(frozen=True)
class SourceHealth:
    """Our entry: `lag` messages behind (None: not known yet); `current` the last source sequence on
    the target (None: not known); `heard`: NATS reached the source at least once; `inactive`:
    seconds since the entry last made progress (see `progress`)."""

    lag: int | None = None
    error: str | None = None
    current: int | None = None
    heard: bool = False
    inactive: float = 0.0
    reported_lag: int | None = None  # NATS's own, before `measured` (None: not measured)

    def unready(self, settings: NativeSettings) -> tuple[str, str] | None:
        """(reason, message) when the entry runs without error but is not to be called Ready."""
        if not self.heard:
            return CONNECTING, "NATS has not reached the source yet"
        if self.inactive > parse_duration(settings.max_inactive):
            return SOURCE_INACTIVE, (f"{self.lag} messages wait on the source and none arrived for "
                                     f"{self.inactive:.0f}s (spec.native.maxInactive {settings.max_inactive}): "
                                     "is the link to the source down?")
        if self.lag is not None and self.lag > settings.max_lag:
            return LAGGING, f"{self.lag} messages behind the source (spec.native.maxLag {settings.max_lag})"
        return None


def source_health(info: Mapping[str, Any] | None) -> SourceHealth:
    """From one `sources[]` (or `mirror`) element of the target stream's info: `active` is -1 until
    NATS first reaches the source."""
    if info is None:
        return SourceHealth()
    active = info.get("active")
    error = info.get("error")
    text = (str(error.get("description") or error) if isinstance(error, Mapping) else str(error)) if error else None
    return SourceHealth(lag=int(info.get("lag") or 0), error=text,
                        heard=isinstance(active, int | float) and active >= 0)


def covers(topic: str, subjects: Sequence[str]) -> bool:
    """Whether the entry's filter takes every message of a stream with these subjects: then the
    source's last sequence minus the last one delivered counts exactly the messages still to come."""
    return topic == ">" or list(subjects) == [topic]


def measured(seen: SourceHealth, delivered: int | None, source_last: int | None) -> SourceHealth:
    """NATS's lag with the operator's count from both ends: `source_last` None when the source's own
    servers cannot be read or the filter does not cover the stream (see `covers`)."""
    lag = seen.lag
    if delivered is not None and source_last is not None:
        lag = max(lag or 0, source_last - delivered)
    return replace(seen, lag=lag, current=delivered if delivered is not None else seen.current, reported_lag=seen.lag)


def silent(previous: Progress | None, seen: SourceHealth, now: dt.datetime, settings: NativeSettings) -> str | None:
    """NATS reports lag 0 and no error, yet nothing arrived for `maxInactive` while the source holds
    more (counted from both ends): its consumer on the source waits for a sequence that will not
    come, as after a source stream was created again unnoticed. Only meaningful while the target
    reaches the source (a cut link looks the same)."""
    if previous is None or seen.error or not seen.heard or seen.reported_lag != 0 or not seen.lag:
        return None
    if seen.current is not None and seen.current != previous.current:
        return None
    waited = (now - previous.since).total_seconds()
    if waited <= parse_duration(settings.max_inactive):
        return None
    return (f"NATS reports lag 0 but nothing arrived for {waited:.0f}s while the source holds {seen.lag} more "
            "messages")


@dataclass(frozen=True)
class Progress:
    """When the entry last made progress: caught up (lag 0) or its delivered sequence moved."""

    current: int | None
    since: dt.datetime


def progress(previous: Progress | None, seen: SourceHealth, now: dt.datetime) -> tuple[Progress, SourceHealth]:
    """The progress after this look, and `seen` with its `inactive` seconds."""
    if previous is None or not seen.lag or (seen.current is not None and seen.current != previous.current):
        return Progress(seen.current, now), replace(seen, inactive=0.0)
    return previous, replace(seen, inactive=max(0.0, (now - previous.since).total_seconds()))


def status_fields(health: SourceHealth, last: Progress | None) -> dict[str, Any]:
    """status.lag, and status.lastActive: when the entry last made progress."""
    fields: dict[str, Any] = {}
    if health.lag is not None:
        fields["lag"] = health.lag
    if last is not None and health.heard:
        fields["lastActive"] = last.since.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return fields


def recreated(recorded_created: str | None, created: str, last_seq: int, delivered: int | None) -> str | None:
    """Why the source stream is not the one the entry has been reading (None: it is): its creation
    time changed, or its last sequence is below what was already delivered (deleted and created
    again). NATS then reports lag 0 and copies nothing (nats-server #8346, #6206)."""
    if recorded_created and created and created != recorded_created:
        return f"it was created again at {created} (it was created at {recorded_created})"
    if delivered is not None and delivered > last_seq:
        return f"its last sequence {last_seq} is below sequence {delivered}, already delivered"
    return None
