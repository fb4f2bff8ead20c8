"""NATS connections per side: URL lists, credentials, TLS (manual or Puppet layout), reconnect forever,
material reloaded from its files at every reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import ssl
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import nats
import nats.errors
from nats.aio.client import Client

from replicator.config.model import Profile, redact_url
from replicator.observe.metrics import WorkerMetrics
from replicator.transport import reads
from replicator.transport.material import Material, MaterialError, MaterialFiles, MaterialSource, source_for
from replicator.transport.tls_probe import handshake_alert
from replicator.transport.websockets import need_websockets
from replicator.transport.wire import widen_reads

log = logging.getLogger(__name__)

Side = Literal["source", "target"]


class ConnectError(Exception):
    """A connection that cannot succeed as configured (bad TLS material, refused credentials)."""


def material_files(profile: Profile, side: Side) -> MaterialFiles:
    """The files one side reads: its TLS settings (if any) and its credentials: a `.creds` file, a
    user JWT file and its nkey seed file (the Go format's `choria: {jwt_file, seed_file}` and
    `?jwt=&nkey=`), or a user name file and a password file. A new credential setting maps onto
    `MaterialFiles` here; reloading, last-good and the connect callbacks then come with it."""
    tls = profile.tls_for(side)
    jwt, seed = profile.jwt_for(side) or (None, profile.nkey_for(side))
    username, password = profile.basic_auth_for(side) or (None, None)
    files = MaterialFiles(creds=profile.credentials_for(side), jwt=jwt, seed=seed, username=username,
                          password=password, token=profile.token_for(side))
    if tls is None:
        return files
    ca, cert, key = tls.files()
    return replace(files, tls=True, ca=ca, cert=cert, key=key, insecure=tls.insecure)


def material_for(profile: Profile, side: Side) -> MaterialSource | None:
    """The process-wide source of one side's material (None: nothing to read)."""
    files = material_files(profile, side)
    return source_for(files) if files else None


def load_material(source: MaterialSource, side: str) -> Material:
    """The material, or a `ConnectError` naming the side and the file when it never parsed."""
    try:
        return source.load()
    except MaterialError as err:
        files = source.files
        what = "credentials file" if err.where in (files.creds, files.jwt, files.seed, files.username,
                                                   files.password, files.token) else "TLS files"
        raise ConnectError(f"{side} {what} unusable: {err}") from None


def connect_options(profile: Profile, side: Side, name: str) -> dict[str, Any]:
    """nats-py's connect options. TLS and credentials come from the side's `MaterialSource`: a
    `Client` from `new_client` asks it again at every (re)connect, so rotated files are used. The
    servers are dialled without their query (`?credentials=...&connect_timeout=5s`): the profile
    reads those options."""
    urls = list(profile.url_options(side).servers)
    opts: dict[str, Any] = {
        "servers": urls,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 1,
        "connect_timeout": profile.connect_timeout_for(side) or 5,
        "ping_interval": 5,
        "max_outstanding_pings": 3,
        "pending_size": 32 * 1024 * 1024,
        # Subjects come from JetStream and the config, already valid; validating each costs a regex.
        "skip_subject_validation": True,
    }
    opts.update(server_options(urls, material_for(profile, side), side))
    tls = profile.tls_for(side)
    if tls is not None and tls.handshake_first:
        opts["tls_handshake_first"] = True
    return opts


def server_options(urls: list[str], source: MaterialSource | None, what: str) -> dict[str, Any]:
    """`servers` without their userinfo, the userinfo as options, and the material's TLS context and
    credential callbacks: how every connection (profile or not) reaches its servers."""
    servers, opts = split_userinfo(urls)
    need_websockets(servers)
    out: dict[str, Any] = {"servers": servers, **opts}
    if source is not None:
        out.update(material_options(source, what))
        if "tls" in out:
            out["servers"] = [u.replace("nats://", "tls://", 1) for u in servers]
    return out


def material_options(source: MaterialSource, side: str) -> dict[str, Any]:
    """The TLS context and credential callbacks as of now (the client asks again at each reconnect)."""
    material = load_material(source, side)
    opts: dict[str, Any] = {}
    if material.user is not None:
        opts["signature_cb"] = source.sign
        if material.user.jwt is not None:
            opts["user_jwt_cb"] = source.user_jwt
    if material.ssl_context is not None:
        opts["tls"] = material.ssl_context
    return opts


def new_client(profile: Profile, side: Side) -> Client:
    """A client that takes TLS and credentials from the side's files at every (re)connect."""
    return client_for(material_for(profile, side), require_tls=profile.tls_for(side) is not None)


def client_for(source: MaterialSource | None, *, require_tls: bool = False) -> Client:
    widen_reads()
    reads.install()
    nc = _Client()
    nc.material = source
    nc.require_tls = require_tls
    return nc


async def connect_files(servers: list[str], files: MaterialFiles, what: str, **options: Any) -> Client:
    """A connection outside a profile (the fleet-health job): the same URLs, userinfo, reloading
    material, plaintext refusal and judgement of the first connect as a profile's, but one attempt
    only (a batch job fails rather than waits). `what` names it in errors; a `ConnectError` says
    why (a certificate, credential or URL problem, or the servers that could not be reached)."""
    source = source_for(files) if files else None
    opts = {**options, **server_options(servers, source, what)}
    made: list[Client] = []

    def make_client() -> Client:
        made.append(client_for(source, require_tls=files.tls))
        return made[-1]

    attempt = _FirstConnect(opts, make_client, what, str(options.get("name") or what), None, None)
    attempt.stopping = lambda: bool(made) and made[-1].is_closed  # our own close is no warning
    nc = await attempt.run(lambda: False)
    if nc is None:
        raise ConnectError(f"{what} connection to {attempt.where} failed: {attempt.last_error}")
    return nc


async def connect_once(profile: Profile, side: Side, name: str, **overrides: Any) -> Client:
    """A short-lived connection (command-line tools): the profile's URLs and material, with
    `overrides` (e.g. no reconnects) applied."""
    opts = connect_options(profile, side, name)
    opts.update(overrides)
    nc = new_client(profile, side)
    await nc.connect(**opts)
    return nc


def split_userinfo(urls: list[str]) -> tuple[list[str], dict[str, str]]:
    """URLs without `user:password@` / `token@`, and that userinfo, percent-decoded, as options.

    nats-py sends URL userinfo as written, so a password with `@ / # ? %` (percent-encoded, as
    URLs require) could never authenticate. Done only when every URL carries the same userinfo
    (one cluster, one identity); otherwise the URLs are left to nats-py as they are.
    """
    try:
        parts = [urlsplit(u) for u in urls]
        infos = {(p.username, p.password) for p in parts}
    except ValueError:
        return urls, {}
    if len(infos) != 1:
        return urls, {}
    user, password = infos.pop()
    if user is None:
        return urls, {}
    clean = [p._replace(netloc=p.netloc.rsplit("@", 1)[1]).geturl() for p in parts]
    if password is None:
        return clean, {"token": unquote(user)}
    return clean, {"user": unquote(user), "password": unquote(password)}


class _Client(Client):
    """nats-py's client with three changes, each for a connection that must live for months:

    - TLS and credentials come from a `MaterialSource` at every TLS handshake and CONNECT, so the
      next (re)connect after a rotation presents the new certificate, CA bundle, credentials or
      password (a user and password from files go into the options nats-py's CONNECT reads);
    - CONNECT (and so credentials) is never sent in plaintext when TLS is configured: nats-py
      upgrades to TLS only when the server's INFO asks for it, so a server without TLS, or a man in
      the middle posing as one, would otherwise get the user, password or token in the clear;
    - a server that ends a live connection because its credentials were revoked or expired (after a
      rotation) causes a reconnect with the current material, as the Go client does; nats-py would
      close the connection for good.
    """

    require_tls = False
    material: MaterialSource | None = None

    @property
    def ssl_context(self) -> ssl.SSLContext:
        material = self.material.current() if self.material is not None else None
        if material is not None and material.ssl_context is not None:
            return material.ssl_context
        return super().ssl_context

    def _connect_command(self) -> bytes:
        server = self._current_server
        plain = server is not None and server.uri.scheme in ("nats", "tls")
        if self.require_tls and plain and not self.options.get("tls_handshake_first"):
            if not (self._server_info or {}).get("tls_required"):
                raise nats.errors.Error(f"nats: {PLAINTEXT_REFUSED}")
        material = self.material.current() if self.material is not None else None
        if material is not None and material.user is not None:
            user = material.user  # one generation for both: the JWT and the key that signs the nonce
            self._auth_configured = True
            self._signature_cb = user.sign
            self._user_jwt_cb = user.user_jwt if user.jwt is not None else None
            self._public_nkey = None if user.jwt is not None else user.public_key
        if material is not None and material.basic is not None:
            self._auth_configured = True
            self.options["user"], self.options["password"] = material.basic.user, material.basic.password
        if material is not None and material.token is not None:
            self._auth_configured = True
            self.options["token"] = material.token
        return super()._connect_command()

    async def _process_err(self, err_msg: str) -> None:
        text = err_msg.strip().strip("'")
        if self.is_connected and self.options.get("allow_reconnect") and any(
                hint in text.lower() for hint in _CREDENTIAL_HINTS):
            await self._error_cb(nats.errors.Error(f"nats: {text} (reconnecting with the current credentials)"))
            await self._process_op_err(nats.errors.Error(f"nats: {text}"))
            return
        await super()._process_err(err_msg)


PLAINTEXT_REFUSED = "TLS is configured but the server does not offer TLS (refusing to connect in plaintext)"
_TRANSIENT_SSL = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError, ssl.SSLWantWriteError,
                  ssl.SSLSyscallError)
_CREDENTIAL_HINTS = ("authorization violation", "authentication expired", "authentication revoked")
_URL_HINTS = ("invalid connect url", "invalid hostname in connect url", "mixing of websocket")


def permanent_reason(err: BaseException) -> str | None:
    """Why retrying cannot help (certificates, credentials, a TLS downgrade), or None if it might.

    Used only for the first connect: a process whose certificate expired or whose password is wrong
    must fail at start with one clear line, not retry in silence forever.
    """
    if isinstance(err, ssl.SSLCertVerificationError):
        detail = err.verify_message or err.reason or str(err)
        return f"TLS: cannot verify the server's certificate ({detail}); check the CA (tls.ca / ssl_dir)"
    if isinstance(err, ssl.SSLError) and not isinstance(err, _TRANSIENT_SSL):
        reason = (err.reason or str(err)).lower().replace("_", " ")
        if "alert" in reason:  # the server ended the handshake, e.g. "sslv3 alert certificate expired"
            alert = reason.split("alert", 1)[1].strip()
            if "certificate" in alert or alert.endswith(" ca"):
                return f"TLS: the server rejected our client certificate ({alert}); check tls.cert / tls.key"
            return f"TLS: the server refused the handshake ({alert})"
        return f"TLS handshake failed ({reason})"
    if isinstance(err, ImportError):  # nats-py imports nkeys only when a credentials file is used
        return f"credentials need the Python package {err.name or 'nkeys'!r} (pip install 'nats-py[nkeys]')"
    text = str(err).lower()
    if PLAINTEXT_REFUSED.lower() in text:
        return PLAINTEXT_REFUSED
    if any(hint in text for hint in _URL_HINTS):
        return f"the URL cannot be used ({err}); check it (user:password must be percent-encoded)"
    if any(hint in text for hint in _CREDENTIAL_HINTS):
        return ("the server refused the credentials (authorization violation); check the URL's "
                "user/password or token, the user and password files, or the credentials file")
    return None


async def connect(
    profile: Profile,
    side: Side,
    name: str,
    metrics: WorkerMetrics | None = None,
    *,
    stopping: Callable[[], bool] = lambda: False,
    on_change: Callable[[], None] | None = None,
) -> Client:
    """Connect, retrying the first connect until it works, is hopeless, or we are stopping.

    nats-py retries a first connect forever by itself (we ask it to reconnect forever), reporting
    each failure only to `error_cb`. So failures are judged there: certificate, TLS and credential
    problems (on every configured server) end the attempt with a `ConnectError` naming the side and
    the problem; anything else (refused, timeouts, a server still starting) keeps retrying. A stop
    request also ends the attempt. Later disconnects are handled by the client's own reconnect loop.
    """
    attempt = _FirstConnect(connect_options(profile, side, name), functools.partial(new_client, profile, side),
                            side, name, metrics, on_change)
    attempt.stopping = stopping
    source = material_for(profile, side)
    if metrics is not None and source is not None:
        for role in ("client", "ca"):
            if load_material(source, side).not_after(role) is not None:
                metrics.certificate(side, role, functools.partial(source.not_after, role))
    delay = 0.5
    while True:
        nc = await attempt.run(stopping)
        if nc is not None:
            return nc
        if stopping():
            raise ConnectError(f"{side} connection to {attempt.where}: stopped before connecting")
        await asyncio.sleep(delay * (0.75 + random.random() / 2))
        delay = min(delay * 2, 10.0)


class _FirstConnect:
    """One profile side's connection: callbacks for its whole life, judgement of its first connect."""

    def __init__(self, opts: dict[str, Any], make_client: Callable[[], Client], side: str, name: str,
                 metrics: WorkerMetrics | None, on_change: Callable[[], None] | None) -> None:
        self.opts = opts
        self.where = ", ".join(redact_url(u) for u in self.opts["servers"])
        self.make_client = make_client
        self.side, self.name, self.metrics, self.on_change = side, name, metrics, on_change
        self.last_error = "no server could be reached"
        self.stopping: Callable[[], bool] = lambda: False
        self.connected = False
        self.permanent = 0
        self.fatal: asyncio.Future[str] | None = None
        self.nc: Client | None = None

    async def run(self, stopping: Callable[[], bool]) -> Client | None:
        """The connected client; None if nats-py gave up by itself (retry); ConnectError if hopeless."""
        self.nc = nc = self.make_client()
        self.permanent = 0
        self.fatal = fatal = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(nc.connect(**{
            **self.opts, "error_cb": self.error_cb, "disconnected_cb": self.disconnected_cb,
            "reconnected_cb": self.reconnected_cb, "closed_cb": self.closed_cb,
        }))
        try:
            while not task.done():
                await asyncio.wait({task, fatal}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    break
                if fatal.done():
                    raise ConnectError(f"{self.side} connection to {self.where} failed: {fatal.result()}")
                if stopping():
                    raise ConnectError(f"{self.side} connection to {self.where}: stopped before connecting")
        except BaseException:  # given up, stopped or cancelled: the attempt and its connection go, then it propagates
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        err = task.exception()
        if err is None:
            self.connected = True
            return nc
        with contextlib.suppress(Exception):
            await nc.close()
        reason = permanent_reason(err)
        if reason is not None:
            raise ConnectError(f"{self.side} connection to {self.where} failed: {reason}") from None
        if self.metrics:
            self.metrics.errors.inc()
        self.last_error = _describe(err) if not isinstance(err, nats.errors.NoServersError) else self.last_error
        log.warning("%s connection to %s failed: %s", self.side, self.where, self.last_error)
        return None

    async def error_cb(self, err: Exception) -> None:
        if self.metrics:
            self.metrics.errors.inc()
        reason = None if self.connected else permanent_reason(err)
        if reason is None and not self.connected and isinstance(err, ConnectionResetError):
            reason = await self._reset_reason()
        if not self.connected:
            self.last_error = reason or _describe(err)
        if reason is None:
            if not self.stopping():  # closing a connection that is still reconnecting fails its attempt
                log.warning("%s connection %s error: %s", self.side, self.name, _describe(err))
            return
        self.permanent += 1
        if self.permanent == 1:
            log.error("%s connection %s to %s: %s", self.side, self.name, self.where, reason)
        # Every configured server said so (nats-py walks the list in turn): retrying cannot help.
        if self.permanent >= len(self.opts["servers"]) and self.fatal is not None and not self.fatal.done():
            self.fatal.set_result(reason)

    async def _reset_reason(self) -> str | None:
        """Why a TLS server reset the first connect, if it was our certificate (`tls_probe`)."""
        nc = self.nc
        server = nc._current_server if nc is not None else None
        if nc is None or server is None or "tls" not in self.opts or not server.uri.hostname or not server.uri.port:
            return None  # nats-py gives every server URL a port
        alert = await handshake_alert(server.uri.hostname, server.uri.port, nc.ssl_context,
                                      handshake_first=bool(self.opts.get("tls_handshake_first")))
        return permanent_reason(alert) if alert is not None else None

    async def disconnected_cb(self) -> None:
        if not self.stopping():  # a clean shutdown disconnects too: not worth a warning
            log.warning("%s connection %s disconnected from %s", self.side, self.name, self.where)
        if self.on_change:
            self.on_change()

    async def reconnected_cb(self) -> None:
        if self.metrics:
            self.metrics.reconnections.inc()
        log.info("%s connection %s reconnected", self.side, self.name)
        if self.on_change:
            self.on_change()

    async def closed_cb(self) -> None:
        if self.metrics:
            self.metrics.closed.inc()
        if self.on_change:
            self.on_change()


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    for nested in getattr(err, "exceptions", None) or []:
        text = f"{text}: {nested}"
    return text
