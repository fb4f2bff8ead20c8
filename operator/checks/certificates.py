"""The certificates in a resource's TLS Secrets (`ca.crt`, `tls.crt`), for the `CertificatesExpiring`
condition: parsed with the replicator's own rules (`replicator/transport/material.py`)."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping
from typing import Any

from replication_operator.model import status as st
from replication_operator.model.spec import TLS_CA, TLS_CERT
from replication_operator.model.status import MountedCertificate

from replicator.transport.material import MaterialError, parse_certificates


def mounted_certificates(secret: str, data: Mapping[str, bytes],
                         names: tuple[str, str] = (TLS_CA, TLS_CERT)) -> list[MountedCertificate]:
    """Every CA of the CA key (`ca.crt`) and the leaf of the certificate key (`tls.crt`); a key that
    does not parse is listed unreadable."""
    found: list[MountedCertificate] = []
    for key, role in ((names[0], "ca"), (names[1], "client")):
        if key not in data:
            continue
        where = f'secret "{secret}" key "{key}"'
        try:
            certs = parse_certificates(data[key], where, role)  # type: ignore[arg-type]
        except MaterialError:
            found.append(MountedCertificate(where))
            continue
        for cert in certs if role == "ca" else certs[:1]:
            found.append(MountedCertificate(where, cert.subject, dt.datetime.fromtimestamp(cert.not_after, dt.UTC)))
    return found


def config_map_certificates(name: str, key: str, pem: bytes) -> list[MountedCertificate]:
    """The CAs of a CA ConfigMap's bundle (trust-manager), for the expiry watch."""
    where = f'configmap "{name}" key "{key}"'
    try:
        certs = parse_certificates(pem, where, "ca")
    except MaterialError:
        return [MountedCertificate(where)]
    return [MountedCertificate(where, c.subject, dt.datetime.fromtimestamp(c.not_after, dt.UTC)) for c in certs]


def secret_certificates(name: str, secret: Mapping[str, Any],
                        names: tuple[str, str] = (TLS_CA, TLS_CERT)) -> list[MountedCertificate]:
    """`mounted_certificates` of a Secret object as the API returns it (base64 data)."""
    data = {k: base64.b64decode(v or "") for k, v in (secret.get("data") or {}).items()}
    return mounted_certificates(name, data, names)


Event = tuple[str, str, str]  # (type, reason, message)


def certificate_event(condition: Mapping[str, Any] | None, posted: str | None) -> tuple[str | None, Event | None]:
    """The warning to remember as posted, and the event to post: a Warning when a certificate
    warning appears or changes, a Normal one when it clears, nothing otherwise."""
    warning = condition["message"] if condition and condition["status"] == "True" else None
    if warning == posted:
        return posted, None
    if warning is not None and condition is not None:
        return warning, ("Warning", str(condition["reason"]), warning)
    if posted is not None:
        return None, ("Normal", st.CERTIFICATES_VALID, "mounted certificates are valid again")
    return None, None
