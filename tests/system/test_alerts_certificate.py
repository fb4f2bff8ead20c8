"""A certificate inside the expiry window: the worker's client certificate (mounted from its TLS
Secret) expires in 7 days, inside the chart's 14: CertificateExpiring fires and the resource's
CertificatesExpiring condition agrees. The Secret renewed, the kubelet swaps the mounted files, the
worker's gauge follows them and the alert resolves, without a restart."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import nats

from replicator.demo.local_nats import LocalNatsServer
from tests.support import certs
from tests.support.system import seams
from tests.support.system.installed import installed, monitoring_values
from tests.support.system.scenario import NS, replication


def _tls_secret(ca: certs.CertificateAuthority, days: int) -> dict[str, Any]:
    client = ca.issue("replicator", client=True, days=days)
    data = {"ca.crt": ca.pem, "tls.crt": certs.cert_pem(client.cert), "tls.key": certs.key_pem(client.key)}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "source-tls", "namespace": NS, "labels": {"streamreplicator.io/usable": "true"}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


async def test_a_certificate_inside_the_expiry_window_fires_and_resolves_once_renewed(
    tmp_path: Path, target_server: LocalNatsServer
) -> None:
    ca = certs.CertificateAuthority.create(days=365)
    files = certs.write_server(ca, tmp_path / "server", "nats")
    with LocalNatsServer(name="tls-source", extra_config=certs.server_tls_block(files), scheme="tls",
                         store_dir=tmp_path / "source") as source:
        client = ca.issue("publisher", client=True, days=365)
        ssl_files = client.write(tmp_path / "publisher.pem", tmp_path / "publisher-key.pem")
        context = ssl.create_default_context(cafile=str(files.ca))
        context.load_cert_chain(*map(str, ssl_files))
        nc = await nats.connect(source.url, tls=context)
        await nc.jetstream().add_stream(name="CMDB", subjects=["acme.cmdb.>"])
        await nc.close()
        # The operator re-reads Secrets at its resync (default 5 minutes): shortened like the alerts.
        values = monitoring_values(operator_env={"STREAM_REPLICATOR_RESYNC_INTERVAL": "3"})
        async with installed(tmp_path / "system", values, [NS]) as system:
            await system.cluster.apply(_tls_secret(ca, days=7))
            resource = replication("cmdb", source.url, target_server.url, "CMDB", "acme.cmdb.>", mode="ordered")
            resource["spec"]["source"]["tlsSecret"] = "source-tls"
            await system.cluster.apply(resource)
            await system.until(lambda: seams.alert_state(system, "StreamReplicatorCertificateExpiring",
                                                         namespace=NS) == "firing", 90, "CertificateExpiring firing")
            (alert,) = [a for a in seams.active_alerts(system)
                        if a["labels"]["alertname"] == "StreamReplicatorCertificateExpiring"]
            labels = alert["labels"]
            assert (labels["side"], labels["certificate"]) == ("source", "client")
            assert _condition((system.resource(NS, "cmdb") or {})["status"], "CertificatesExpiring")["status"] == "True"

            pods = system.kubelet.pods(NS, "cmdb")
            await system.cluster.apply(_tls_secret(ca, days=90))
            await system.until(lambda: seams.alert_state(system, "StreamReplicatorCertificateExpiring",
                                                         namespace=NS) == "inactive", 60,
                               "CertificateExpiring resolved")
            assert [p.process.proc.pid for p in system.kubelet.pods(NS, "cmdb")] == [p.process.proc.pid for p in pods]
            await system.until(lambda: _condition((system.resource(NS, "cmdb") or {})["status"],
                                                  "CertificatesExpiring").get("status") == "False", 60,
                               "the CertificatesExpiring condition cleared")
            assert seams.active_alerts(system) == []
