"""Decentralised NATS auth for tests: operator, account and user JWTs and a `.creds` file, no `nsc`.

`source_credentials`/`target_credentials` take a `.creds` file, which only an operator-mode
server accepts. `nsc` is not available here, so this builds the chain the way it does: nkeys
(ed25519, via the `nkeys` package nats-py itself uses for credentials) and JWTs signed with the
issuer's key (`alg: ed25519-nkey`). The account enables JetStream with unlimited storage.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
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
                                    "default_permissions": {"pub": {}, "sub": {}}}}, self.operator)

    def user_jwt(self) -> str:
        return encode_jwt({"sub": self.user.public, "name": "replicator",
                           "nats": {"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1,
                                    "data": -1, "payload": -1}}, self.account)

    def server_config(self) -> str:
        """The block for `LocalNatsServer(extra_config=...)`."""
        return (
            f'operator: "{self.operator_jwt()}"\n'
            f"system_account: {self.system.public}\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f'  {self.system.public}: "{self.account_jwt(self.system, "SYS", False)}"\n'
            f'  {self.account.public}: "{self.account_jwt(self.account, "FLEET", True)}"\n'
            "}\n"
        )

    def write_creds(self, path: Path) -> Path:
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"{self.user_jwt()}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{self.user.seed.decode()}\n"
            "------END USER NKEY SEED------\n"
        )
        path.chmod(0o600)
        return path
