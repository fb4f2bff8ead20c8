"""The operator's NATS connections, made with a resource's own credentials.

The operator has no NATS identity of its own: it connects as the workers do, with the Secrets the
spec names, so it can only see what the replication itself may see. The Secrets are read again for
every connection (so a rotated Secret is used at once) and parsed by the replicator's own rules
(`replicator/transport/material.py`): a damaged certificate or a key that does not match it is
named by Secret and key, never shown. Secret material stays in memory, or for the client key in a
private temporary directory removed right after loading.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from replication_operator.model.connection_fields import Connection

from replicator.config import redact_url
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.material import Material, MaterialError, MaterialFiles, build

# What connecting fails with: the servers or the way to them (NATS_ERRORS), or a server URL nats-py cannot parse.
CONNECT_FAILURES: tuple[type[BaseException], ...] = (*NATS_ERRORS, ValueError)


class NatsStatusError(Exception):
    """Why NATS could not be reached or read for a resource; safe to show (no secrets, URLs redacted)."""


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
    token: bytes | None = None
    seed: bytes | None = None

    @property
    def tls(self) -> bool:
        return bool(self.ca or self.cert)

    def material(self) -> Material:
        data = {role: value for role, value in (("ca", self.ca), ("cert", self.cert), ("key", self.key),
                                                ("creds", self.credentials), ("username", self.username),
                                                ("password", self.password), ("token", self.token),
                                                ("seed", self.seed)) if value is not None}
        def name(role: str) -> str | None:
            return self.names.get(role, role) if role in data else None

        files = MaterialFiles(tls=self.tls, ca=name("ca"), cert=name("cert"), key=name("key"), creds=name("creds"),
                              username=name("username"), password=name("password"), token=name("token"),
                              seed=name("seed"))
        try:
            return build(files, data)
        except MaterialError as err:
            raise NatsStatusError(f"{err.where} cannot be used: {err.reason}") from None


def auth_from_secrets(endpoint: Connection, secrets: Mapping[str, Mapping[str, bytes]]) -> Auth:
    """`secrets` maps a Secret name to its data."""
    creds = None
    names: dict[str, str] = {}
    if endpoint.credentials_secret:
        ref = endpoint.credentials_secret
        creds = secrets.get(ref.name, {}).get(ref.key)
        names["creds"] = f'secret "{ref.name}" key "{ref.key}"'
    basic: dict[str, bytes | None] = {}
    if endpoint.basic_auth_secret:
        basic_ref = endpoint.basic_auth_secret
        for role, key in (("username", basic_ref.username_key), ("password", basic_ref.password_key)):
            basic[role] = secrets.get(basic_ref.name, {}).get(key)
            names[role] = f'secret "{basic_ref.name}" key "{key}"'
            if basic[role] is None:  # checked before, but the Secret may have changed since
                raise NatsStatusError(f'secret "{basic_ref.name}" has no key "{key}"')
    single: dict[str, bytes | None] = {}
    for role, ref in (("token", endpoint.token_secret), ("seed", endpoint.nkey_secret)):
        if ref is not None:
            single[role] = secrets.get(ref.name, {}).get(ref.key)
            names[role] = f'secret "{ref.name}" key "{ref.key}"'
            if single[role] is None:  # checked before, but the Secret may have changed since
                raise NatsStatusError(f'secret "{ref.name}" has no key "{ref.key}"')
    tls: Mapping[str, bytes] = secrets.get(endpoint.tls_secret, {}) if endpoint.tls_secret else {}
    ca, cert, key = endpoint.tls_names
    for role, name in (("ca", ca), ("cert", cert), ("key", key)):
        names[role] = f'secret "{endpoint.tls_secret}" key "{name}"'
    return Auth(credentials=creds, ca=tls.get(ca), cert=tls.get(cert), key=tls.get(key), names=names,
                username=basic.get("username"), password=basic.get("password"), token=single.get("token"),
                seed=single.get("seed"))


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
    if material.user is not None and material.user.jwt is None:  # a bare nkey: nats-py signs with the seed
        options["nkeys_seed_str"] = material.user.seed.decode()
    elif material.user is not None:  # signs the nonce of each CONNECT with the seed from the Secret
        options["signature_cb"] = material.user.sign
        options["user_jwt_cb"] = material.user.user_jwt
    if material.token is not None:  # the token from the Secret, never from the URL
        options["token"] = material.token
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
    except CONNECT_FAILURES as err:
        raise NatsStatusError(f"cannot connect to {redact_url(url)}: {describe(err)}") from None


@contextlib.asynccontextmanager
async def jetstream_on(url: str, auth: Auth, time_limit: float) -> AsyncIterator[JetStreamContext]:
    """JetStream on `url` for one probe, its connection closed on leaving whatever happened."""
    nc = await connect(url, auth, time_limit)
    try:
        yield nc.jetstream(timeout=time_limit)
    finally:
        await nc.close()


def describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) < 300 else text[:300] + "..."
