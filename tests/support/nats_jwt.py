"""Decentralised NATS auth for tests: operator, account and user JWTs and a `.creds` file, no `nsc`.

`source_credentials`/`target_credentials` take a `.creds` file, which only an operator-mode
server accepts. `nsc` is not available here, so this builds the chain the way it does: nkeys
(ed25519, via the `nkeys` package nats-py itself uses for credentials) and JWTs signed with the
issuer's key (`alg: ed25519-nkey`). The account enables JetStream with unlimited storage.

For rotation tests the server can run the `full` account resolver (a directory, updated at run
time): `revoke` a user, `rotate_user` to a new one, and `push_account` sends the updated account JWT
to the server as `nsc push` does, signed in as the system account's user.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys


@dataclass
class Key:
    seed: bytes
    kind: str

    @classmethod
    def create(cls, kind: str) -> Key:
        prefix = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
                  "user": nkeys.PREFIX_BYTE_USER}[kind]
        return cls(nkeys.encode_seed(os.urandom(32), prefix), kind)

    @property
    def pair(self) -> Any:
        return nkeys.from_seed(bytearray(self.seed))

    @property
    def public(self) -> str:
        return str(self.pair.public_key.decode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def encode_jwt(claims: dict[str, Any], issuer: Key) -> str:
    claims = {**claims, "iat": int(time.time()), "iss": issuer.public, "jti": ""}
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = issuer.pair.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64(signature)}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
             "conn": -1, "leaf": -1}


@dataclass
class Decentralised:
    """An operator with a system account and one JetStream-enabled account with one user."""

    operator: Key
    system: Key
    account: Key
    user: Key
    revocations: dict[str, int] = field(default_factory=dict)
    system_user: Key = field(default_factory=lambda: Key.create("user"))

    @classmethod
    def create(cls) -> Decentralised:
        return cls(Key.create("operator"), Key.create("account"), Key.create("account"), Key.create("user"))

    def operator_jwt(self) -> str:
        return encode_jwt({"sub": self.operator.public, "name": "sr-test-operator",
                           "nats": {"type": "operator", "version": 2,
                                    "system_account": self.system.public}}, self.operator)

    def account_jwt(self, key: Key, name: str, jetstream: bool) -> str:
        limits: dict[str, Any] = dict(UNLIMITED)
        if jetstream:
            limits.update({"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1})
        return encode_jwt({"sub": key.public, "name": name,
                           "nats": {"type": "account", "version": 2, "limits": limits,
                                    "default_permissions": {"pub": {}, "sub": {}},
                                    **({"revocations": dict(self.revocations)}
                                       if key is self.account and self.revocations else {})}}, self.operator)

    def user_jwt(self, user: Key | None = None, account: Key | None = None) -> str:
        user = user or self.user
        return encode_jwt({"sub": user.public, "name": "replicator",
                           "nats": {"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1,
                                    "data": -1, "payload": -1}}, account or self.account)

    def server_config(self, resolver_dir: Path | None = None) -> str:
        """The block for `LocalNatsServer(extra_config=...)`; with `resolver_dir`, the `full`
        resolver that accepts account updates at run time (`push_account`)."""
        resolver = "resolver: MEMORY\n"
        if resolver_dir is not None:
            resolver = f'resolver: {{ type: full, dir: "{resolver_dir}", allow_delete: false }}\n'
        return (
            f'operator: "{self.operator_jwt()}"\n'
            f"system_account: {self.system.public}\n"
            f"{resolver}"
            "resolver_preload: {\n"
            f'  {self.system.public}: "{self.account_jwt(self.system, "SYS", False)}"\n'
            f'  {self.account.public}: "{self.account_jwt(self.account, "FLEET", True)}"\n'
            "}\n"
        )

    def rotate_user(self) -> Key:
        """A new user for the account (the old one keeps working until revoked); returns the old."""
        old, self.user = self.user, Key.create("user")
        return old

    def revoke(self, user: Key) -> None:
        """Every JWT of `user` issued until now is invalid once the account is pushed."""
        self.revocations[user.public] = int(time.time()) + 1

    async def push_account(self, url: str, tls: Any = None) -> None:
        """Send the account JWT to a `full`-resolver server (as `nsc push`), as the system user."""
        import nats
        from nats.aio.client import RawCredentials

        creds = RawCredentials(self.creds_text(self.system_user, self.system))
        nc = await nats.connect(url, user_credentials=creds, max_reconnect_attempts=1, tls=tls)
        try:
            reply = await nc.request(f"$SYS.REQ.ACCOUNT.{self.account.public}.CLAIMS.UPDATE",
                                     self.account_jwt(self.account, "FLEET", True).encode(), timeout=5)
            answer = json.loads(reply.data)
            assert "error" not in answer, answer
        finally:
            await nc.close()

    def creds_text(self, user: Key | None = None, account: Key | None = None) -> str:
        user = user or self.user
        return (
            "-----BEGIN NATS USER JWT-----\n"
            f"{self.user_jwt(user, account)}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{user.seed.decode()}\n"
            "------END USER NKEY SEED------\n"
        )

    def write_creds(self, path: Path) -> Path:
        path.write_text(self.creds_text())
        path.chmod(0o600)
        return path
