"""NATS connections per side: URL lists, credentials, TLS (manual or Puppet layout), reconnect forever."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable
from typing import Any, Literal

import nats
from nats.aio.client import Client

from replicator.config import Profile, TLSConfig, redact_url
from replicator.metrics import WorkerMetrics

log = logging.getLogger(__name__)

Side = Literal["source", "target"]


class ConnectError(Exception):
    """A connection that cannot succeed as configured (bad TLS material, refused credentials)."""


def tls_context(tls: TLSConfig) -> ssl.SSLContext:
    ca, cert, key = tls.files()
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert and key:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise ConnectError(f"TLS files unusable ({ca or '-'}, {cert or '-'}, {key or '-'}): {err}") from None
    if tls.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def connect_options(profile: Profile, side: Side, name: str) -> dict[str, Any]:
    settings = profile.settings
    urls = (settings.source_url if side == "source" else settings.target_url).split(",")
    opts: dict[str, Any] = {
        "servers": urls,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 1,
        "connect_timeout": 5,
        "ping_interval": 5,
        "max_outstanding_pings": 3,
        "pending_size": 32 * 1024 * 1024,
        # Subjects come from JetStream and the config, already valid; validating each costs a regex.
        "skip_subject_validation": True,
    }
    creds = profile.credentials_for(side)
    if creds:
        opts["user_credentials"] = creds
    tls = profile.tls_for(side)
    if tls:
        opts["tls"] = tls_context(tls)
        opts["servers"] = [u.replace("nats://", "tls://", 1) for u in urls]
    return opts


async def connect(
    profile: Profile,
    side: Side,
    name: str,
    metrics: WorkerMetrics | None = None,
    *,
    stopping: Callable[[], bool] = lambda: False,
    on_change: Callable[[], None] | None = None,
) -> Client:
    """Connect, retrying the first connect with backoff until it works or we are stopping.

    Later disconnects are handled by the client's own reconnect loop (forever).
    """
    opts = connect_options(profile, side, name)
    where = ", ".join(redact_url(u) for u in opts["servers"])

    async def error_cb(err: Exception) -> None:
        if metrics:
            metrics.errors.inc()
        log.warning("%s connection %s error: %s", side, name, _describe(err))

    async def disconnected_cb() -> None:
        if not stopping():  # a clean shutdown disconnects too: not worth a warning
            log.warning("%s connection %s disconnected from %s", side, name, where)
        if on_change:
            on_change()

    async def reconnected_cb() -> None:
        if metrics:
            metrics.reconnections.inc()
        log.info("%s connection %s reconnected", side, name)
        if on_change:
            on_change()

    async def closed_cb() -> None:
        if metrics:
            metrics.closed.inc()
        if on_change:
            on_change()

    delay = 0.5
    while True:
        try:
            return await nats.connect(
                **opts, error_cb=error_cb, disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb, closed_cb=closed_cb,
            )
        except ssl.SSLError as err:
            raise ConnectError(f"{side} TLS handshake with {where} failed: {err.reason or err}") from None
        except Exception as err:  # noqa: BLE001 - any failure to connect is retried the same way
            text = _describe(err)
            if "authorization" in text.lower() or "authentication" in text.lower():
                log.error("%s %s refused the credentials: %s (retrying)", side, where, text)
            else:
                log.warning("%s connection to %s failed: %s (retrying in %.1fs)", side, where, text, delay)
            if metrics:
                metrics.errors.inc()
            if stopping():
                raise ConnectError(f"{side} connection to {where} failed: {text}") from None
            await asyncio.sleep(delay * (0.75 + random.random() / 2))
            delay = min(delay * 2, 10.0)


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    for nested in getattr(err, "exceptions", None) or []:
        text = f"{text}: {nested}"
    return text
