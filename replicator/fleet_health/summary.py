"""The compact fleet-health summary in a JetStream KV bucket, for dashboards and the operator's status.

Keys: `summary` (fleet totals, per-site rows, run counters) and `site.<token>` per replicator.
Replicator names may hold characters KV keys refuse (spaces, `*`, `>`, non-ASCII) or dots that would
split the key, so `<token>` escapes every UTF-8 byte outside `A-Z a-z 0-9 _ -` as `=XX` (upper-case
hex): `edge/west 1` -> `edge=2Fwest=201`. The mapping is deterministic and reversible, so two
replicators never share a key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from replicator.fleet_health.connection import NatsConnection, connect

DEFAULT_BUCKET = "FLEET_HEALTH"
SUMMARY_KEY = "summary"
SUMMARY_SCHEMA_ID = "stream-replicator/v1/fleet_health_summary"
SITE_SCHEMA_ID = "stream-replicator/v1/fleet_health_site"
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def key_token(name: str) -> str:
    return "".join(chr(b) if b in _SAFE else f"={b:02X}" for b in name.encode("utf-8"))


def site_key(replicator: str) -> str:
    return f"site.{key_token(replicator)}"


def _compact(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}


def build_summary(
    *,
    stream: str,
    run: int,
    run_time: int,
    last_sequence: int,
    fleet: Mapping[str, Any],
    sites: Sequence[Mapping[str, Any]],
    totals: Mapping[str, int],
) -> dict[str, Any]:
    return {
        "$schema": SUMMARY_SCHEMA_ID,
        "stream": stream,
        "run": run,
        "last_run": run_time,
        "last_sequence": last_sequence,
        "fleet": _compact(fleet),
        "sites": [_compact(site) for site in sites],
        **totals,
    }


def site_documents(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`site.<token>` -> that site's row with the run it belongs to."""
    stamp = {k: summary[k] for k in ("stream", "run", "last_run", "last_sequence")}
    return {site_key(site["replicator"]): {"$schema": SITE_SCHEMA_ID, **site, **stamp} for site in summary["sites"]}


def _encode(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), sort_keys=False).encode()


async def _bucket(js: Any, bucket: str) -> KeyValue:
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        return await js.create_key_value(bucket=bucket, history=5, description="stream-replicator fleet health")


async def publish_summary(
    url: NatsConnection | str, bucket: str, summary: Mapping[str, Any], credentials: str | None = None
) -> None:
    nc = await connect(url, credentials, name="fleet-health-summary")
    try:
        kv = await _bucket(nc.jetstream(), bucket)
        for key, document in site_documents(summary).items():
            await kv.put(key, _encode(document))
        # Last: a reader that sees the new summary also finds the site keys of the same run.
        await kv.put(SUMMARY_KEY, _encode(summary))
    finally:
        await nc.close()
