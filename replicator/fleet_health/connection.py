"""How the job reaches the advisory cluster: URLs and the files to read, the same on every process.

Every connection setting the replicator has is here: TLS `manual` (ca, cert, key) or `puppet`
(ssl_dir + identity), a `.creds` file, a user JWT file with its nkey seed file (or a seed alone), a
user name file with a password file, a token file, and user/password or a token in the URL. The settings hold
only URLs and file *paths*; the driver resolves them once (the Puppet identity defaults to the
driver's FQDN) and ships them inside the pickled reader, so each executor opens the same files with
the replicator's own connection code (`transport/connections.py`, `transport/material.py`) and
nothing secret travels in the Spark conf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nats.aio.client import Client
from pydantic import ValidationError

from replicator.config.model import TLSConfig
from replicator.config.urls import url_userinfo
from replicator.transport.connections import connect_files
from replicator.transport.material import MaterialFiles

# Reader option -> command-line flag (`--tls-ca` ...), for messages and for the job's arguments.
FILE_OPTIONS = ("credentials", "user_jwt", "nkey_seed", "user_file", "password_file", "token_file", "tls_ca",
                "tls_cert", "tls_key", "tls_ssl_dir")
OPTIONS = (*FILE_OPTIONS, "tls_scheme", "tls_identity", "tls_insecure")


@dataclass(frozen=True)
class NatsConnection:
    """URL(s) and the resolved `MaterialFiles` (picklable: it travels to the executors)."""

    url: str
    files: MaterialFiles = field(default_factory=MaterialFiles)

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]

    @classmethod
    def build(
        cls,
        url: str,
        *,
        credentials: str | None = None,
        user_jwt: str | None = None,
        nkey_seed: str | None = None,
        user_file: str | None = None,
        password_file: str | None = None,
        token_file: str | None = None,
        tls_scheme: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ssl_dir: str | None = None,
        tls_identity: str | None = None,
        tls_insecure: bool = False,
    ) -> NatsConnection:
        """Validated as the config file's `tls` block is; `ValueError` names the option at fault."""
        if user_jwt and not nkey_seed:
            raise ValueError("user_jwt needs nkey_seed: the seed signs the server's nonce")
        if bool(user_file) != bool(password_file):
            raise ValueError("user_file and password_file go together (a user name and its password)")
        ways = [name for name, given in (("credentials", credentials), ("user_jwt/nkey_seed", user_jwt or nkey_seed),
                                         ("user_file/password_file", user_file), ("token_file", token_file))
                if given]
        if ways and url_userinfo(url):  # the worker's rule too (`config.model.check_auth`)
            ways.insert(0, "a user:password or token in the url")
        if len(ways) > 1:
            raise ValueError(f"{' and '.join(ways)} exclude each other: one way to authenticate")
        files = MaterialFiles(creds=credentials or None, jwt=user_jwt or None, seed=nkey_seed or None,
                              username=user_file or None, password=password_file or None, token=token_file or None)
        scheme = tls_scheme or ("puppet" if tls_ssl_dir else "manual")
        tls_given = any((tls_ca, tls_cert, tls_key, tls_ssl_dir, tls_identity, tls_insecure, tls_scheme))
        if tls_given:
            try:
                tls = TLSConfig(scheme=scheme, ca=tls_ca, cert=tls_cert, key=tls_key,  # type: ignore[arg-type]
                                ssl_dir=tls_ssl_dir, identity=tls_identity, insecure=tls_insecure)
            except ValidationError as err:
                problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
                raise ValueError(f"TLS options (tls_scheme {scheme}): {problems}") from None
            ca, cert, key = tls.files()
            files = replace(files, tls=True, ca=ca, cert=cert, key=key, insecure=tls.insecure)
        return cls(url=url, files=files)

    @classmethod
    def from_options(cls, options: Mapping[str, str | None]) -> NatsConnection:
        """From the data source's (lower-cased) string options."""
        get = {k: (options.get(k) or None) for k in OPTIONS}
        insecure = str(get.pop("tls_insecure") or "false").lower()
        if insecure not in ("true", "false"):
            raise ValueError(f"jetstream source: option tls_insecure must be true or false, got {insecure!r}")
        url = options.get("url")
        if not url:
            raise ValueError("jetstream source: option url required")
        return cls.build(url, tls_insecure=insecure == "true", **get)  # type: ignore[arg-type]

    def options(self) -> dict[str, str]:
        """The data source options that make a reader connect like this (paths only, already resolved:
        the executors do not guess the Puppet identity again)."""
        f = self.files
        out = {"url": self.url}
        for option, value in (("credentials", f.creds), ("user_jwt", f.jwt), ("nkey_seed", f.seed),
                              ("user_file", f.username), ("password_file", f.password), ("token_file", f.token),
                              ("tls_ca", f.ca),
                              ("tls_cert", f.cert), ("tls_key", f.key)):
            if value:
                out[option] = value
        if f.tls:
            out["tls_scheme"] = "manual"
            if f.insecure:
                out["tls_insecure"] = "true"
        return out


def as_connection(target: NatsConnection | str, credentials: str | None = None) -> NatsConnection:
    """A plain URL (with an optional `.creds` file) is a connection too: the simple calls stay simple."""
    if isinstance(target, NatsConnection):
        return target
    return NatsConnection.build(target, credentials=credentials)


async def connect(target: NatsConnection | str, credentials: str | None = None, name: str = "fleet-health",
                  **overrides: Any) -> Client:
    """A connection that fails fast (a batch job should error out, not wait for a dead server), with
    a `ConnectError` naming a TLS, credential or URL problem. Files are read as the replicator reads
    them: a file rotated during a run is used from the next (re)connect on, a half-written one is not."""
    conn = as_connection(target, credentials)
    options: dict[str, Any] = {
        "name": name,
        "connect_timeout": 5,
        "max_reconnect_attempts": 3,
        "allow_reconnect": True,
        **overrides,
    }
    return await connect_files(conn.servers, conn.files, "fleet-health", **options)
