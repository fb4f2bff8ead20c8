"""Lag, last activity and fleet totals, read from NATS with the resource's own credentials (through
`nats/connection.py`): the source consumer's info, and the fleet-health job's summary in its KV bucket.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nats.js import api as js_api
from nats.js.errors import NotFoundError
from replication_operator.model.spec import ReplicationSpec
from replication_operator.nats.connection import Auth, NatsStatusError, connect, describe, jetstream_on

from replicator.copier.loops import loop_notes
from replicator.copier.loss import LOSS_NOTE, Note
from replicator.transport.errors import NATS_ERRORS

SUMMARY_KEY = "summary"


def _timestamp(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


LOOPS = "copyLoop"  # not a status field: the reconciler turns it into the CopyLoop condition


def consumer_fields(info: js_api.ConsumerInfo) -> dict[str, Any]:
    """`lag` (messages not yet delivered), `lastActive` (last ack, else last delivery), `sourceLoss`
    (what the workers noted as lost at the source, `copier/loss.py`); `LOOPS`: what the workers noted
    about copy loops ("" for nothing)."""
    fields: dict[str, Any] = {"lag": int(info.num_pending or 0), LOOPS: loop_notes(info.config.metadata or {})}
    last = None
    if info.ack_floor and info.ack_floor.last_active:
        last = info.ack_floor.last_active
    elif info.delivered and info.delivered.last_active:
        last = info.delivered.last_active
    stamp = _timestamp(last)
    if stamp:
        fields["lastActive"] = stamp
    loss = Note.parse((info.config.metadata or {}).get(LOSS_NOTE)) if info.config else None
    if loss is not None:
        fields["sourceLoss"] = {"lost": loss.lost, "byReason": loss.by, "first": loss.first, "last": loss.last,
                                "at": loss.at}
    return fields


@dataclass(frozen=True)
class FleetSummary:
    """The fleet-health summary as the operator uses it: `status` becomes status.fleet; `sites`
    (one row per site: `site`, the counts and `availability` when known) only feeds the operator's
    gauges, since a fleet's site list can be long for a status."""

    status: dict[str, Any]
    sites: tuple[dict[str, Any], ...] = ()


def _counts(row: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key in ("nodes", "healthy", "timeout", "expired", "unknown"):
        if isinstance(row.get(key), int | float) and not isinstance(row.get(key), bool):
            found[key] = int(row[key])
    if isinstance(row.get("availability"), int | float) and not isinstance(row.get("availability"), bool):
        found["availability"] = float(row["availability"])
    return found


def fleet_sites(raw: bytes) -> tuple[dict[str, Any], ...]:
    """The summary's per-site rows (`sites`: `replicator` and its counts); rows without a site name
    are skipped."""
    doc = _summary_document(raw)
    rows = doc.get("sites")
    if not isinstance(rows, list):
        return ()
    return tuple({"site": row["replicator"], **_counts(row)} for row in rows
                 if isinstance(row, dict) and isinstance(row.get("replicator"), str) and row["replicator"])


def _summary_document(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise NatsStatusError(f"fleet summary is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise NatsStatusError("fleet summary is not a JSON object")
    return doc


def fleet_fields(raw: bytes) -> dict[str, Any]:
    """status.fleet from the fleet-health job's `summary` (replicator/fleet_health/summary.py):
    totals under `fleet` (or at the top), `last_run` in unix seconds or RFC 3339."""
    doc = _summary_document(raw)
    totals = doc.get("fleet") or doc.get("totals") or doc
    if not isinstance(totals, dict):
        raise NatsStatusError("fleet summary has no totals object")
    fleet = _counts(totals)
    last_run = doc.get("last_run", totals.get("last_run"))
    if isinstance(last_run, int | float) and not isinstance(last_run, bool):
        fleet["lastRun"] = _timestamp(dt.datetime.fromtimestamp(float(last_run), dt.UTC))
    elif isinstance(last_run, str):
        try:
            fleet["lastRun"] = _timestamp(dt.datetime.fromisoformat(last_run.replace("Z", "+00:00")))
        except ValueError:
            pass
    return fleet


async def read_consumer(spec: ReplicationSpec, auth: Auth, time_limit: float) -> dict[str, Any]:
    async with jetstream_on(spec.source.url, auth, time_limit) as js:
        stream = spec.source.stream
        try:
            stream = stream or await js.find_stream_name_by_subject(spec.topic)
            info = await js.consumer_info(stream, spec.consumer_name, timeout=time_limit)
        except NotFoundError:
            where = f"stream {stream}" if stream else f"a stream for {spec.topic}"
            raise NatsStatusError(
                f"consumer {spec.consumer_name} not found on {where} (not started yet?)"
            ) from None
        except NATS_ERRORS as err:
            raise NatsStatusError(f"cannot read consumer {spec.consumer_name}: {describe(err)}") from None
        return consumer_fields(info)


async def read_fleet(spec: ReplicationSpec, auth: Auth, time_limit: float) -> FleetSummary:
    assert spec.fleet_health and spec.advisory_endpoint
    url = spec.fleet_health.url or spec.advisory_endpoint.url
    nc = await connect(url, auth, time_limit)
    try:
        js = nc.jetstream(timeout=time_limit)
        bucket = spec.fleet_health.kv_bucket
        try:
            kv = await js.key_value(bucket)
            entry = await kv.get(SUMMARY_KEY)
        except NotFoundError:
            raise NatsStatusError(f"no fleet summary yet (bucket {bucket}, key {SUMMARY_KEY})") from None
        except NATS_ERRORS as err:
            raise NatsStatusError(f"cannot read fleet summary from {bucket}: {describe(err)}") from None
        raw = entry.value or b""
        return FleetSummary(fleet_fields(raw), fleet_sites(raw))
    finally:
        await nc.close()


@dataclass(frozen=True)
class SourceState:
    """The source stream as its own servers report it (not through the target's link)."""

    subjects: tuple[str, ...]
    first_seq: int
    last_seq: int
    created: str  # RFC 3339, as the server reports it: a recreated stream has a new one


async def read_source_stream(spec: ReplicationSpec, stream: str, auth: Auth, time_limit: float) -> SourceState:
    """The native engine's lag and recreation checks: read from the source's own servers, so that
    they keep counting while the link from the target is down."""
    nc = await connect(spec.source.url, auth, time_limit)
    try:
        try:
            msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=time_limit)
        except NATS_ERRORS as err:
            raise NatsStatusError(f"cannot read source stream {stream}: {describe(err)}") from None
        info = json.loads(msg.data or b"{}")
        if info.get("error"):
            raise NatsStatusError(f"cannot read source stream {stream}: {info['error'].get('description')}")
        state, config = info.get("state") or {}, info.get("config") or {}
        return SourceState(tuple(config.get("subjects") or ()), int(state.get("first_seq") or 0),
                           int(state.get("last_seq") or 0), str(info.get("created") or ""))
    finally:
        await nc.close()
