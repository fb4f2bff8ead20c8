"""Advice about a spec the operator accepts and builds anyway: Warning events, nothing blocked.

A password written into a NATS URL still works (older resources keep running), but the URL is
copied as it is into the worker's ConfigMap and the fleet-health job's arguments, where anyone who
may read ConfigMaps or pods in the namespace reads it. A `basicAuthSecret` keeps it in a Secret.
Pure: a spec in, (reason, message) pairs out; messages show URLs redacted.
"""

from __future__ import annotations

from replication_operator.model.spec import ReplicationSpec

from replicator.config.model import redact_url
from replicator.config.urls import url_userinfo

PASSWORD_IN_URL = "PasswordInURL"


def advise(spec: ReplicationSpec) -> list[tuple[str, str]]:
    """A `PasswordInURL` warning for each URL of the spec that carries `user:password@`."""
    urls = [(f"spec.{e.side}.url", e.url, str(e.side)) for e in (spec.source, spec.target)]
    if spec.fleet_health and spec.fleet_health.url and spec.advisory:
        urls.append(("spec.fleetHealth.url", spec.fleet_health.url, spec.advisory.cluster))
    return [
        (PASSWORD_IN_URL,
         f"{field} carries a user and password ({redact_url(url)}): it is copied into the worker's ConfigMap"
         f" and the fleet-health job's arguments, readable by anyone who may read those; put them in a"
         f" kubernetes.io/basic-auth Secret named in spec.{side}.basicAuthSecret and drop them from the URL")
        for field, url, side in urls if url_userinfo(url) == "user:password"
    ]
