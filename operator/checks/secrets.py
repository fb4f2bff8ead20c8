"""The Secrets a resource names: checked before anything is built, read for the operator's own NATS
connections.

A check keeps only what the status needs: whether each Secret exists, whether the policy lets the
resource use it (its labels), which keys it has, and the certificates of TLS Secrets (public). A
read, for the status probe and the native engine, takes the values of one side's Secrets for one
connection, after checking the label again (it may have gone since the last pass). Messages name
Secrets and keys, never values.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from replication_operator.checks import policy
from replication_operator.checks.certificates import config_map_certificates, secret_certificates
from replication_operator.kube import APIError, KubeApi, error_text
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.connection_fields import Connection
from replication_operator.model.spec import Endpoint, ReplicationSpec, Side
from replication_operator.nats import connection

PULL_SECRET_KEY = ".dockerconfigjson"  # a kubernetes.io/dockerconfigjson Secret's one key
OPTIONAL = ""  # an optional env secretKeyRef: the Secret's labels are checked, its keys are not
SecretCheck = tuple[list[st.Problem], dict[str, frozenset[str]], list[st.MountedCertificate]]


@dataclass(frozen=True)
class SecretNeed:
    """A Secret the pods mount: one key of it (credentials, user name, password, S3), or (`key` None) a
    TLS Secret checked by `tls_problem`."""

    side: Side | Literal["fleetHealth", "template"]
    secret: str
    key: str | None
    tls_names: tuple[str, str, str] = ("ca.crt", "tls.crt", "tls.key")  # a TLS Secret's (CA, cert, key)


def secret_needs(spec: ReplicationSpec) -> list[SecretNeed]:
    needs: list[SecretNeed] = []
    sides: tuple[Side, Side] = ("source", "target")
    for side in sides:
        endpoint = spec.endpoint(side)
        if endpoint.credentials_secret:
            needs.append(SecretNeed(side, endpoint.credentials_secret.name, endpoint.credentials_secret.key))
        if endpoint.basic_auth_secret:
            ref = endpoint.basic_auth_secret
            needs += [SecretNeed(side, ref.name, key) for key in ref.keys]
        for ref in (endpoint.token_secret, endpoint.nkey_secret):
            if ref is not None:
                needs.append(SecretNeed(side, ref.name, ref.key))
        if endpoint.tls_secret:
            needs.append(SecretNeed(side, endpoint.tls_secret, None, endpoint.tls_names))
    fleet = spec.fleet_health
    s3 = fleet.s3.credentials_secret if fleet and fleet.s3 else None
    if s3 is not None:  # the Spark pods take the S3 key pair from it (env)
        for key in (s3.access_key_id_key, s3.secret_access_key_key, s3.session_token_key):
            if key:
                needs.append(SecretNeed("fleetHealth", s3.name, key))
    for where, shape in (("template", spec.template), ("fleetHealth", fleet.template if fleet else None)):
        if shape is None:
            continue
        for ref in shape.pod.image_pull_secrets if shape.pod else []:
            needs.append(SecretNeed(where, ref.name, PULL_SECRET_KEY))
        for var in shape.container.env if shape.container else []:
            if var.value_from and var.value_from.secret_key_ref and not var.value_from.secret_key_ref.optional:
                needs.append(SecretNeed(where, var.value_from.secret_key_ref.name, var.value_from.secret_key_ref.key))
            elif var.value_from and var.value_from.secret_key_ref:  # optional: the label rule still holds
                needs.append(SecretNeed(where, var.value_from.secret_key_ref.name, OPTIONAL))
    return needs


def tls_problem(keys: Collection[str], names: tuple[str, str, str] = ("ca.crt", "tls.crt", "tls.key")) -> str | None:
    """What a TLS Secret lacks: it needs the CA (`ca.crt`), or the certificate with its key
    (`tls.crt`, `tls.key`), or all three; `names` are the Secret's key names for them."""
    ca, cert, key = names
    has_ca = ca in keys
    has_cert, has_key = cert in keys, key in keys
    if has_cert != has_key:
        return f'key "{key}"' if has_cert else f'key "{cert}"'
    if not has_ca and not has_cert:
        return f'keys "{ca}" or "{cert}"/"{key}"'
    return None


async def check_secrets(api: KubeApi, rules: policy.Policy, spec: ReplicationSpec) -> SecretCheck:
    """Every referenced Secret exists, may be used (policy) and has its keys; returns the problems,
    the Secrets' key names (the config names only the TLS files a Secret has) and the certificates
    of the TLS Secrets (for `CertificatesExpiring`)."""
    keys: dict[str, frozenset[str]] = {}
    labels: dict[str, dict[str, Any]] = {}
    held: dict[str, list[st.MountedCertificate]] = {}  # TLS Secret name -> its certificates
    missing: dict[str, str] = {}  # Secret name -> why it is unusable
    ns = spec.namespace
    needs = secret_needs(spec)
    tls = {need.secret: need.tls_names for need in needs if need.key is None}
    for name in dict.fromkeys(need.secret for need in needs):
        try:
            secret = await api.get(naming.SECRET, ns, name)
            if secret is None:
                missing[name] = f'not found in namespace "{ns}"'
            else:
                labels[name] = dict((secret.get("metadata") or {}).get("labels") or {})
                keys[name] = frozenset((secret.get("data") or {}).keys())
                if name in tls:
                    held[name] = secret_certificates(name, secret, tls[name][:2])
        except APIError as err:
            missing[name] = f'cannot be read in namespace "{ns}": {error_text(err)}'
    problems = [st.Problem(v.reason, v.message) for v in policy.secret_violations(rules, ns, labels)]
    refused = {name for name in labels if not policy.secret_usable(rules, ns, labels[name])}
    certificates = [c for name, found in held.items() if name not in refused for c in found]
    problems += need_problems([n for n in needs if n.secret not in refused], keys, missing, ns)
    ca_problems, ca_certificates = await _ca_config_maps(api, spec)
    return problems + ca_problems, keys, certificates + ca_certificates


async def _ca_config_map(api: KubeApi, ns: str, name: str, key: str) -> bytes:
    """The PEM bundle under `key` of a ConfigMap; `NatsStatusError` says why it cannot be had."""
    try:
        found = await api.get(naming.CONFIGMAP, ns, name)
    except APIError as err:
        raise connection.NatsStatusError(f'configmap "{name}" cannot be read: {error_text(err)}') from None
    if found is None:
        raise connection.NatsStatusError(f'configmap "{name}" (key "{key}") not found in namespace "{ns}"')
    data = found.get("data") or {}
    if key not in data:
        raise connection.NatsStatusError(f'configmap "{name}" has no key "{key}" in namespace "{ns}"')
    return str(data[key]).encode()


async def _ca_config_maps(api: KubeApi, spec: ReplicationSpec) -> tuple[list[st.Problem], list[st.MountedCertificate]]:
    """Each side's CA ConfigMap exists and has its key (`SecretMissing`/`SecretKeyMissing`, as a TLS
    Secret would be reported); its CAs join the certificate expiry watch."""
    problems: list[st.Problem] = []
    held: list[st.MountedCertificate] = []
    for ref in dict.fromkeys(e.ca_config_map for e in (spec.source, spec.target) if e.ca_config_map):
        try:
            pem = await _ca_config_map(api, spec.namespace, ref.name, ref.key)
        except connection.NatsStatusError as err:
            reason = st.SECRET_KEY_MISSING if "has no key" in str(err) else st.SECRET_MISSING
            problems.append(st.Problem(reason, str(err)))
            continue
        held += config_map_certificates(ref.name, ref.key, pem)
    return problems, held


def need_problems(needs: list[SecretNeed], keys: Mapping[str, frozenset[str]], missing: Mapping[str, str],
                  ns: str) -> list[st.Problem]:
    """`SecretMissing` once per missing Secret (naming the keys wanted from it), `SecretKeyMissing`
    per missing key, and what a TLS Secret lacks."""
    problems: list[st.Problem] = []
    wanted: dict[str, list[str | None]] = {}
    tls_names: dict[str, tuple[str, str, str]] = {}
    for need in needs:
        wanted.setdefault(need.secret, []).append(need.key)
        if need.key is None:
            tls_names[need.secret] = need.tls_names
    for name, wanted_keys in wanted.items():
        if name in missing and all(k == OPTIONAL for k in wanted_keys):
            continue  # an optional env secretKeyRef: the pod starts without it
        if name in missing:
            named = [f'"{k}"' for k in dict.fromkeys(wanted_keys) if k is not None]
            what = (f" (key {named[0]})" if len(named) == 1 else f" (keys {', '.join(named)})" if named
                    else " (TLS)")
            problems.append(st.Problem(st.SECRET_MISSING, f'secret "{name}"{what} {missing[name]}'))
            continue
        for key in dict.fromkeys(wanted_keys):
            if key == OPTIONAL:
                continue
            if key is not None and key not in keys[name]:
                problems.append(st.Problem(
                    st.SECRET_KEY_MISSING, f'secret "{name}" has no key "{key}" in namespace "{ns}"'))
            elif key is None and (lack := tls_problem(keys[name], tls_names[name])):
                problems.append(st.Problem(
                    st.SECRET_KEY_MISSING, f'TLS secret "{name}" lacks {lack} in namespace "{ns}"'))
    return problems


async def read_auth(api: KubeApi, rules: policy.Policy, spec: ReplicationSpec, endpoint: Endpoint) -> connection.Auth:
    """One side's credentials, user and password, and TLS material, read from its Secrets now (so a
    rotated Secret is used at once); `NatsStatusError` names a Secret that cannot be used."""
    return await read_connection_auth(api, rules, spec.namespace, endpoint)


async def read_connection_auth(api: KubeApi, rules: policy.Policy, namespace: str,
                               endpoint: Connection) -> connection.Auth:
    """`read_auth` for any connection in `namespace` (a side, or a NatsConnection the operator checks)."""
    secrets: dict[str, dict[str, bytes]] = {}
    for name in endpoint.secrets:
        try:
            secret = await api.get(naming.SECRET, namespace, name)
        except APIError as err:
            raise connection.NatsStatusError(f'secret "{name}" cannot be read: {error_text(err)}') from None
        if secret is None:
            raise connection.NatsStatusError(f'secret "{name}" not found in namespace "{namespace}"')
        # Checked again as the values are read: the label may have gone since the last pass.
        if not policy.secret_usable(rules, namespace, (secret.get("metadata") or {}).get("labels")):
            raise connection.NatsStatusError(
                f'secret "{name}" is no longer labelled {policy.USABLE_LABEL}={policy.USABLE_VALUE}')
        secrets[name] = {k: base64.b64decode(v or "") for k, v in (secret.get("data") or {}).items()}
    auth = connection.auth_from_secrets(endpoint, secrets)
    ref = endpoint.ca_config_map
    if ref is None:
        return auth
    pem = await _ca_config_map(api, namespace, ref.name, ref.key)  # trust-manager's bundle wins
    return dataclasses.replace(auth, ca=pem, names={**auth.names, "ca": f'configmap "{ref.name}" key "{ref.key}"'})


class Secrets:
    """The Secrets of resources as the policy lets them be used: the reconciler checks them, the
    status probe and the native engine read a side's values for a connection."""

    def __init__(self, api: KubeApi, rules: policy.Policy) -> None:
        self.api = api
        self.rules = rules

    async def check(self, spec: ReplicationSpec) -> SecretCheck:
        return await check_secrets(self.api, self.rules, spec)

    async def auth(self, spec: ReplicationSpec, endpoint: Endpoint) -> connection.Auth:
        return await read_auth(self.api, self.rules, spec, endpoint)
