"""Lag, last activity and fleet totals, read from NATS with the resource's own credentials.

The operator has no NATS identity of its own: it connects as the workers do, with the Secrets the
spec names, so it can only see what the replication itself may see. The Secrets are read again for
every connection (so a rotated Secret is used at once) and parsed by the replicator's own rules
(`replicator/transport/material.py`): a damaged certificate or a key that does not match it is
named by Secret and key, never shown. Secret material stays in memory, or for the client key in a
private temporary directory removed right after loading.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import api as js_api
from nats.js.errors import NotFoundError
from replication_operator.model.spec import TLS_CA, TLS_CERT, TLS_KEY, Endpoint, ReplicationSpec

from replicator.config import redact_url
from replicator.transport.material import Material, MaterialError, MaterialFiles, build

SUMMARY_KEY = "summary"


class NatsStatusError(Exception):
    """Why lag or fleet could not be read; safe to show (no secrets, URLs redacted)."""


@dataclass(frozen=True, repr=False)
class Auth:
    """Credentials and TLS material for one side, as read from its Secrets; `names` says where
    each piece came from (for messages)."""

    credentials: bytes | None = None
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    username: bytes | None = None
    password: bytes | None = None

    @property
    def tls(self) -> bool:
        return bool(self.ca or self.cert)

    def material(self) -> Material:
        data = {role: value for role, value in (("ca", self.ca), ("cert", self.cert), ("key", self.key),
                                                ("creds", self.credentials), ("username", self.username),
                                                ("password", self.password)) if value is not None}
        def name(role: str) -> str | None:
            return self.names.get(role, role) if role in data else None

        files = MaterialFiles(tls=self.tls, ca=name("ca"), cert=name("cert"), key=name("key"), creds=name("creds"),
                              username=name("username"), password=name("password"))
        try:
            return build(files, data)
        except MaterialError as err:
            raise NatsStatusError(f"{err.where} cannot be used: {err.reason}") from None


def auth_from_secrets(endpoint: Endpoint, secrets: Mapping[str, Mapping[str, bytes]]) -> Auth:
    """`secrets` maps a Secret name to its data."""
    creds = None
    names: dict[str, str] = {}
    if endpoint.credentials:
        creds = secrets.get(endpoint.credentials.name, {}).get(endpoint.credentials.key)
        names["creds"] = f'secret "{endpoint.credentials.name}" key "{endpoint.credentials.key}"'
    basic: dict[str, bytes | None] = {}
    if endpoint.basic_auth:
        ref = endpoint.basic_auth
        for role, key in (("username", ref.username_key), ("password", ref.password_key)):
            basic[role] = secrets.get(ref.name, {}).get(key)
            names[role] = f'secret "{ref.name}" key "{key}"'
            if basic[role] is None:  # checked before, but the Secret may have changed since
                raise NatsStatusError(f'secret "{ref.name}" has no key "{key}"')
    tls: Mapping[str, bytes] = secrets.get(endpoint.tls_secret, {}) if endpoint.tls_secret else {}
    for role, key in (("ca", TLS_CA), ("cert", TLS_CERT), ("key", TLS_KEY)):
        names[role] = f'secret "{endpoint.tls_secret}" key "{key}"'
    return Auth(credentials=creds, ca=tls.get(TLS_CA), cert=tls.get(TLS_CERT), key=tls.get(TLS_KEY), names=names,
                username=basic.get("username"), password=basic.get("password"))


def ssl_context(auth: Auth) -> ssl.SSLContext:
    return auth.material().ssl_context or ssl.create_default_context()


async def connect(url: str, auth: Auth, time_limit: float) -> Client:
    servers = [u.strip() for u in url.split(",") if u.strip()]
    options: dict[str, Any] = {
        "servers": servers,
        "name": "stream-replicator-operator",
        "connect_timeout": max(1, int(time_limit)),
        # One attempt per server, then NoServersError (0 would mean "retry this pool for ever").
        "allow_reconnect": False,
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.1,
    }
    material = auth.material()
    if material.user is not None:  # signs the nonce of each CONNECT with the seed from the Secret
        options["signature_cb"] = material.user.sign
        options["user_jwt_cb"] = material.user.user_jwt
    if material.basic is not None:  # the user and password from the Secret, never from the URL
        options["user"], options["password"] = material.basic.user, material.basic.password
    if auth.tls or any(s.startswith(("tls://", "wss://")) for s in servers):
        options["tls"] = material.ssl_context or ssl.create_default_context()

    async def _no_callback(*_: object) -> None:
        return None

    options["error_cb"] = _no_callback
    options["disconnected_cb"] = _no_callback
    try:
        return await asyncio.wait_for(nats.connect(**options), time_limit)
    except Exception as err:
        raise NatsStatusError(f"cannot connect to {redact_url(url)}: {_describe(err)}") from None


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) < 300 else text[:300] + "..."


def _timestamp(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def consumer_fields(info: js_api.ConsumerInfo) -> dict[str, Any]:
    """`lag` (messages not yet delivered) and `lastActive` (last ack, else last delivery)."""
    fields: dict[str, Any] = {"lag": int(info.num_pending or 0)}
    last = None
    if info.ack_floor and info.ack_floor.last_active:
        last = info.ack_floor.last_active
    elif info.delivered and info.delivered.last_active:
        last = info.delivered.last_active
    stamp = _timestamp(last)
    if stamp:
        fields["lastActive"] = stamp
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
    for key in ("nodes", "healthy", "timeout", "expired"):
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
    nc = await connect(spec.source.url, auth, time_limit)
    try:
        js = nc.jetstream(timeout=time_limit)
        stream = spec.source.stream
        try:
            if not stream:
                stream = await js.find_stream_name_by_subject(spec.topic)
            info = await js.consumer_info(stream, spec.consumer_name, timeout=time_limit)
        except NotFoundError:
            where = f"stream {stream}" if stream else f"a stream for {spec.topic}"
            raise NatsStatusError(
                f"consumer {spec.consumer_name} not found on {where} (not started yet?)"
            ) from None
        except Exception as err:
            raise NatsStatusError(f"cannot read consumer {spec.consumer_name}: {_describe(err)}") from None
        return consumer_fields(info)
    finally:
        await nc.close()


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
        except Exception as err:
            raise NatsStatusError(f"cannot read fleet summary from {bucket}: {_describe(err)}") from None
        raw = entry.value or b""
        return FleetSummary(fleet_fields(raw), fleet_sites(raw))
    finally:
        await nc.close()
