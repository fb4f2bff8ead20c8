"""The connection fields of a side: URLs, TLS and one way to authenticate, as Secret (and CA ConfigMap)
references. A StreamReplication's source and target write them inline (model/spec.py `Endpoint`); a
NatsConnection holds them for many (model/connection.py). One definition, so both are described,
validated, mounted and policed alike.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator
from replication_operator.model.fields import NATS_URLS, Model, field, key_field, name_field

from replicator.config.urls import url_options


class SecretKeyRef(Model):
    name: str = name_field("Name of the Secret, in the StreamReplication's namespace.")
    key: str = key_field("Key of the .creds file in the Secret.", "user.creds")


class TokenSecretRef(Model):
    name: str = name_field("Name of the Secret, in the StreamReplication's namespace.")
    key: str = key_field("Key of the token in the Secret.", "token")


class NkeySecretRef(Model):
    name: str = name_field("Name of the Secret, in the StreamReplication's namespace.")
    key: str = key_field("Key of the user nkey seed (`SU...`) in the Secret.", "nkey.seed")


class TlsKeys(Model):
    """The key names inside a TLS Secret: cert-manager's by default; another issuer's can be named."""

    ca: str = key_field("Key of the CA bundle that verifies the server.", "ca.crt")
    cert: str = key_field("Key of the client certificate (with its chain).", "tls.crt")
    key: str = key_field("Key of the client certificate's private key.", "tls.key")


class CaConfigMapRef(Model):
    name: str = name_field("Name of the ConfigMap, in the StreamReplication's namespace (e.g. a trust-manager "
                           "Bundle's target).")
    key: str = key_field("Key of the PEM CA bundle in the ConfigMap.", "ca.crt")


class BasicAuthRef(Model):
    """A user name and password in one Secret (the keys of a `kubernetes.io/basic-auth` Secret)."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": [{
        "rule": "self.usernameKey != self.passwordKey",
        "message": "basicAuthSecret.usernameKey and basicAuthSecret.passwordKey must differ"}]}}

    name: str = name_field("Name of the Secret, in the StreamReplication's namespace.")
    username_key: str = key_field("Key of the user name in the Secret.", "username")
    password_key: str = key_field("Key of the password in the Secret.", "password")

    @property
    def keys(self) -> tuple[str, str]:
        return self.username_key, self.password_key


ONE_WAY_RULES = [
    {"rule": "(has(self.credentialsSecret) ? 1 : 0) + (has(self.basicAuthSecret) ? 1 : 0) + "
             "(has(self.tokenSecret) ? 1 : 0) + (has(self.nkeySecret) ? 1 : 0) <= 1",
     "message": "credentialsSecret, basicAuthSecret, tokenSecret and nkeySecret exclude each other: one way to "
                "authenticate a side"},
    {"rule": "!(has(self.basicAuthSecret) || has(self.tokenSecret) || has(self.nkeySecret)) || "
             "!has(self.url) || !self.url.contains('@')",
     "message": "a basicAuthSecret, tokenSecret or nkeySecret and credentials in the url (user:password@ or token@) "
                "exclude each other: one way to authenticate a side"},
]
CONNECTION_RULES = [
    {"rule": "has(self.url) != has(self.connectionRef)",
     "message": "url or connectionRef: exactly one (a connectionRef names the NatsConnection that holds the url)"},
    {"rule": "!has(self.connectionRef) || !(has(self.credentialsSecret) || has(self.basicAuthSecret) || "
             "has(self.tokenSecret) || has(self.nkeySecret) || has(self.tlsSecret) || has(self.caConfigMap) || "
             "has(self.tlsKeys))",
     "message": "connectionRef excludes credentialsSecret, basicAuthSecret, tokenSecret, nkeySecret, tlsSecret, "
                "caConfigMap and tlsKeys: the NatsConnection holds them"},
]
URL_DESCRIPTION = ("Comma-separated NATS URLs (nats://, tls://, ws://, wss://). A user:password written here is "
                   "copied into the worker's ConfigMap: name a basicAuthSecret instead.")


class ConnectionRef(Model):
    name: str = name_field("Name of the NatsConnection, in the StreamReplication's namespace.")


class Connection(Model):
    """How to reach a NATS cluster: URLs, TLS and one way to authenticate. A side of a StreamReplication
    writes it inline (`Endpoint`), or names a NatsConnection (model/connection.py) that holds it."""

    side: ClassVar[str] = ""  # "source" or "target": where the fields sit, for messages ("": a NatsConnection)

    url: str = field(URL_DESCRIPTION, maxLength=2048, pattern=NATS_URLS)
    credentials_secret: SecretKeyRef | None = field("Secret holding a NATS credentials (.creds) file.", None)
    basic_auth_secret: BasicAuthRef | None = field(
        "Secret holding a NATS user name and password (the keys of a kubernetes.io/basic-auth Secret), mounted "
        "into the pods and read at every (re)connect: the password stays out of the URL, the worker's ConfigMap "
        "and the command lines. Excludes credentialsSecret.", None)
    token_secret: TokenSecretRef | None = field(
        "Secret holding a NATS token (token authentication), mounted into the pods and read at every (re)connect: "
        "the token stays out of the URL, the worker's ConfigMap and the command lines.", None)
    nkey_secret: NkeySecretRef | None = field(
        "Secret holding a user nkey seed (nkey authentication, no JWT): the pods sign the server's nonce with it; "
        "the seed stays out of the URL and the worker's ConfigMap.", None)
    tls_secret: str | None = name_field(
        "Secret with `ca.crt` and/or `tls.crt` + `tls.key` (a kubernetes.io/tls Secret works; other key names "
        "through tlsKeys).", None)
    ca_config_map: CaConfigMapRef | None = field(
        "ConfigMap holding the PEM CA bundle that verifies the server (trust-manager writes one); wins over "
        "tlsSecret's CA. A CA is public: no Secret is needed for it.", None)
    tls_keys: TlsKeys | None = field(
        "Key names inside tlsSecret when they are not cert-manager's `ca.crt`, `tls.crt`, `tls.key`.", None)

    @property
    def where(self) -> str:
        """Where these fields sit in their resource: `spec.source`, `spec.target`, or `spec`."""
        return f"spec.{self.side}" if self.side else "spec"

    @property
    def tls_names(self) -> tuple[str, str, str]:
        """(CA, certificate, key) names inside the TLS Secret."""
        keys = self.tls_keys or TlsKeys()
        return keys.ca, keys.cert, keys.key

    @property
    def secrets(self) -> list[str]:
        """The Secrets this side reads (credentials, user and password, token, nkey, TLS), each once."""
        names = [self.credentials_secret.name if self.credentials_secret else None,
                 self.basic_auth_secret.name if self.basic_auth_secret else None,
                 self.token_secret.name if self.token_secret else None,
                 self.nkey_secret.name if self.nkey_secret else None, self.tls_secret]
        return list(dict.fromkeys(n for n in names if n))

    def auth_ways(self) -> list[str]:
        """The ways this side authenticates, as the fields that give them: Secrets and what its URL carries."""
        where = self.where
        ways = [f"{where}.{k}" for k, v in (("credentialsSecret", self.credentials_secret),
                                            ("basicAuthSecret", self.basic_auth_secret),
                                            ("tokenSecret", self.token_secret),
                                            ("nkeySecret", self.nkey_secret)) if v]
        try:
            opts = url_options(self.url)
        except ValueError:
            return ways  # the worker config's validation names the URL's problem
        if opts.userinfo:
            ways.append(f"a {opts.userinfo} in {where}.url")
        ways += [f"?{k}= in {where}.url" for k in ("credentials", "jwt") if getattr(opts, k)]
        return ways

    @model_validator(mode="after")
    def _one_way_to_authenticate(self) -> Connection:
        ways = self.auth_ways()
        if len(ways) > 1:
            raise ValueError(f"{' and '.join(ways)} exclude each other: one way to authenticate the "
                             f"{self.side or 'connection'}")
        ref = self.basic_auth_secret
        if ref is not None and ref.username_key == ref.password_key:
            raise ValueError(f"{self.where}.basicAuthSecret: usernameKey and passwordKey must differ, not both "
                             f"{ref.username_key!r}")
        return self
