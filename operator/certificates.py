"""The certificates in a resource's TLS Secrets (`ca.crt`, `tls.crt`), for the `CertificatesExpiring`
condition: parsed with the replicator's own rules (`replicator/transport/material.py`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from replication_operator.spec import TLS_CA, TLS_CERT
from replication_operator.status import MountedCertificate

from replicator.transport.material import MaterialError, parse_certificates


def mounted_certificates(secret: str, data: Mapping[str, bytes]) -> list[MountedCertificate]:
    """Every CA of `ca.crt` and the leaf of `tls.crt`; a key that does not parse is listed unreadable."""
    found: list[MountedCertificate] = []
    for key, role in ((TLS_CA, "ca"), (TLS_CERT, "client")):
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
