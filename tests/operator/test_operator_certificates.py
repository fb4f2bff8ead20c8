"""Certificate expiry in the operator: the `CertificatesExpiring` condition from the TLS Secrets the
workers mount, and the operator's own `/metrics` (scraped over HTTP) that the alerting rules use."""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from replication_operator.build.spark_application import schedule_interval
from replication_operator.metrics import FLEET, METRIC_NAMES
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.settings import OperatorConfig

from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.support.certs import CertificateAuthority, cert_pem, key_pem
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

NS = "replication"
NOW = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
WINDOW = dt.timedelta(days=14)


def mounted(days: float, where: str = 'secret "t" key "tls.crt"') -> st.MountedCertificate:
    return st.MountedCertificate(where, "CN=sr", NOW + dt.timedelta(days=days))


@pytest.mark.parametrize(("certificates", "status", "reason", "words"), [
    ([mounted(90), mounted(30, 'secret "t" key "ca.crt"')], "False", st.CERTIFICATES_VALID,
     ['secret "t" key "ca.crt"', "2026-03-31T00:00:00Z"]),
    ([mounted(90), mounted(5)], "True", st.CERTIFICATE_EXPIRING, ["in 5d", "2026-03-06T00:00:00Z", "14d"]),
    ([mounted(-1)], "True", st.CERTIFICATE_EXPIRED, ["expired at 2026-02-28T00:00:00Z"]),
    ([mounted(90), st.MountedCertificate('secret "t" key "ca.crt"')], "True", st.CERTIFICATE_UNREADABLE,
     ['secret "t" key "ca.crt"']),
])
def test_certificate_condition(certificates: list[st.MountedCertificate], status: str, reason: str,
                               words: list[str]) -> None:
    cond = st.certificate_condition(certificates, NOW, WINDOW, 3)
    assert cond is not None
    assert (cond["type"], cond["status"], cond["reason"], cond["observedGeneration"]) == (
        st.CERTIFICATES_EXPIRING, status, reason, 3)
    assert all(w in cond["message"] for w in words), cond["message"]


def test_no_tls_secret_no_condition() -> None:
    assert st.certificate_condition([], NOW, WINDOW, 1) is None
    status = st.build_status(name="x", generation=1, problems=[], deployment=None, desired_replicas=1,
                             old_status=None, now=NOW)
    assert [c["type"] for c in status["conditions"]] == [st.READY, st.PROGRESSING, st.DEGRADED, st.RECONCILING,
                                                       st.STALLED]


def test_schedule_intervals() -> None:
    assert schedule_interval(None) == 3600
    assert schedule_interval("@every 1h30m") == 5400
    assert schedule_interval("*/15 * * * *") == 900
    assert schedule_interval("0 9 * * 1-5", NOW) == 3 * 86400  # Friday to Monday
    assert schedule_interval("@daily") == 86400
    assert schedule_interval("not a schedule") is None


def tls_secret(name: str, ca: CertificateAuthority, days: int) -> dict[str, Any]:
    leaf = ca.issue("sr", client=True, days=days)
    return h.fake_secret(name, NS, {"ca.crt": ca.pem, "tls.crt": cert_pem(leaf.cert), "tls.key": key_pem(leaf.key)})


def resource() -> dict[str, Any]:
    res = h.example("registrations-region", NS)
    for key in ("uid", "generation"):
        res["metadata"].pop(key)
    res["spec"]["source"]["url"] = res["spec"]["target"]["url"] = "nats://127.0.0.1:1"
    res["spec"]["target"]["tlsSecret"] = "central-tls"
    res["spec"]["fleetHealth"]["schedule"] = "@every 15m"
    return res


def condition(api: Api, kind: str) -> dict[str, Any]:
    obj = api.get(naming.STREAM_REPLICATION, NS, "registrations-region") or {}
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def scrape(port: int) -> dict[str, dict[str, float]]:
    """Sample name -> {streamreplication: value} from the operator's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels.get("namespace") == NS
            found.setdefault(sample.name, {})[sample.labels["streamreplication"]] = sample.value
    return found


async def test_expiring_certificate_warns_until_the_secret_is_rotated(cluster: ClusterEmulator, api: Api) -> None:
    ca = CertificateAuthority.create("central-ca", days=400)
    for name in ("region-eu-nats", "central-nats"):
        await api.create(h.fake_secret(name, NS, {"user.creds": b"x", "replicator.creds": b"x"}))
    await api.create(tls_secret("central-tls", ca, days=5))
    config = OperatorConfig(status_interval=0.3, resync_interval=0.5, nats_timeout=1.0)
    async with embedded_operator(str(cluster.url), config=config, metrics_port=0) as reconciler:
        created = await api.create(resource())
        await wait_for(lambda: condition(api, st.CERTIFICATES_EXPIRING).get("status") == "True", within=10)
        cond = condition(api, st.CERTIFICATES_EXPIRING)
        assert cond["reason"] == st.CERTIFICATE_EXPIRING
        assert 'secret "central-tls" key "tls.crt"' in cond["message"] and "in 4d" in cond["message"]
        await wait_for(lambda: st.CERTIFICATE_EXPIRING in h_reasons(api), within=5)

        assert reconciler.metrics_server is not None
        samples = await asyncio.to_thread(scrape, reconciler.metrics_server.port)
        summary = {"stream_replicator_" + n for n in FLEET if n not in ("fleet_health_last_run_timestamp_seconds",
                                                                         "fleet_health_interval_seconds")}
        assert set(samples) == set(METRIC_NAMES) - summary  # no fleet summary read (no NATS here)
        assert samples["stream_replicator_resource_replicas_desired"]["registrations-region"] == 2
        assert samples["stream_replicator_fleet_health_interval_seconds"]["registrations-region"] == 900
        created_at = dt.datetime.fromisoformat(created["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        assert samples["stream_replicator_fleet_health_last_run_timestamp_seconds"]["registrations-region"] == (
            created_at.timestamp())  # no run yet: the resource's creation

        await api.patch(naming.SECRET, NS, "central-tls", {"data": tls_secret("x", ca, days=90)["data"]})
        await wait_for(lambda: condition(api, st.CERTIFICATES_EXPIRING).get("status") == "False", within=10)
        assert condition(api, st.CERTIFICATES_EXPIRING)["reason"] == st.CERTIFICATES_VALID
        await wait_for(lambda: st.CERTIFICATES_VALID in h_reasons(api), within=5)
        for event in api.events(NS, "registrations-region"):
            assert "BEGIN" not in event.get("message", "")

        port = reconciler.metrics_server.port
        await api.delete(naming.STREAM_REPLICATION, NS, "registrations-region")

        async def forgotten() -> bool:
            samples = await asyncio.to_thread(scrape, port)
            return "registrations-region" not in samples.get("stream_replicator_resource_replicas_desired", {})

        await wait_for(forgotten, within=10)


def h_reasons(api: Api) -> list[str]:
    return api.reasons(NS, "registrations-region")
