"""The chart's alerting rules: rendered by the real Helm engine, checked and unit-tested by `promtool`
(Debian package `prometheus`, which `.ci/run` installs), documented with a runbook each, and querying
only metrics that a live replicator and a live operator export (scraped over HTTP)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from helm_chart_support import REPO, one, render
from prometheus_client.parser import text_string_to_metric_families
from replication_operator.metrics import NATIVE_METRIC_NAMES
from replication_operator.settings import OperatorConfig
from test_dashboard import load as load_dashboard
from test_dashboard import metric_names, targets

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import InProcess, make_stream, profile_for, publish_many
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.support.certs import CertificateAuthority, server_tls_block, write_client, write_server
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

UNIT_TESTS = Path(__file__).with_name("prometheus_rules_test.yaml")
RUNBOOKS = REPO / "docs" / "alerts.md"
ENABLED = {"metrics": {"prometheusRule": {"enabled": True}}}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool not found: install the Debian package prometheus (.ci/run does)"
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def rules(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rule = one(render(values or ENABLED), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def write_rules(directory: Path, values: dict[str, Any] | None = None) -> Path:
    rule = one(render(values or ENABLED), "PrometheusRule")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def test_rendered_rules_pass_promtool_check_and_unit_tests(tmp_path: Path) -> None:
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    check = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert check.returncode == 0 and "SUCCESS: 9 rules found" in check.stdout, check.stdout + check.stderr
    test = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    alerts = {r["alert"] for r in rules()}
    assert len(alerts) == 9
    assert fires == alerts and silent == alerts


def test_settings_reach_the_rules_and_still_check(tmp_path: Path) -> None:
    values = {"metrics": {"prometheusRule": {
        "enabled": True, "alertLabels": {"team": "nats"}, "lagGrowingFor": "30m", "lagMinMessages": 5000,
        "certificateExpiryDays": 30, "fleetHealthIntervals": 3, "runbookUrl": "https://wiki.example/sr",
    }}}
    by_name = {r["alert"]: r for r in rules(values)}
    assert all(r["labels"]["team"] == "nats" for r in by_name.values())
    lag = by_name["StreamReplicatorLagGrowing"]
    assert lag["for"] == "30m" and "> 5000" in lag["expr"]
    assert "< 30 * 86400" in by_name["StreamReplicatorCertificateExpiring"]["expr"]
    assert "> 3 * stream_replicator_fleet_health_interval_seconds" in by_name[
        "StreamReplicatorFleetHealthNotRun"]["expr"]
    assert lag["annotations"]["runbook_url"] == "https://wiki.example/sr#streamreplicatorlaggrowing"
    write_rules(tmp_path, values)
    check = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_alert_has_a_runbook_paragraph() -> None:
    manual = RUNBOOKS.read_text()
    sections = dict(re.findall(r"^### (\w+)\n\n(.+?)(?=^##|\Z)", manual, flags=re.M | re.S))
    for rule in rules():
        alert = rule["alert"]
        assert alert in sections, f"docs/alerts.md has no section '### {alert}'"
        assert len(sections[alert].split()) >= 40, f"the runbook of {alert} is too short"
        assert rule["annotations"]["runbook_url"].endswith(f"alerts.md#{alert.lower()}")
        for metric in metric_names(rule["expr"]):
            assert f"`{metric.removesuffix('_total')}`" in sections[alert] or metric in sections[alert], (
                f"the runbook of {alert} does not name {metric}")


# ---- every metric a rule or a dashboard panel queries is exported by live processes


def scrape(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


async def live_replicator_names(tmp: Path) -> set[str]:
    """A replicator with TLS (certificate metrics), sampling and advisories, scraped while it copies."""
    ca = CertificateAuthority.create("alerts-ca")
    client = write_client(ca, tmp / "client", "sr")
    servers = [LocalNatsServer(name=n, store_dir=tmp / n, extra_config=server_tls_block(write_server(ca, tmp / n, n)),
                               scheme="tls").start() for n in ("source", "target")]
    try:
        tls = {"ca": str(client.ca), "cert": str(client.cert), "key": str(client.key)}
        config = {"tls": tls, "topics": {"fleet": {
            "topic": "fleet.>", "name": "sr", "source_url": f"nats://127.0.0.1:{servers[0].port}",
            "target_url": f"nats://127.0.0.1:{servers[1].port}", "inspect_subject_token": 2, "age": "1h",
            "advisory": {"target": "sr.advisories"}}}}
        import nats

        from tests.security.conftest import client_context

        nc = await nats.connect(servers[0].url, tls=client_context(client))
        try:
            await make_stream(nc)
            await publish_many(nc, 20)
        finally:
            await nc.close()
        runner = InProcess(profile_for(config), monitor_port=0)
        async with runner as replicator:
            await wait_for(lambda: replicator.readiness()[0], within=20)
            assert replicator.monitor is not None
            return await asyncio.to_thread(scrape, replicator.monitor.port)
    finally:
        for server in servers:
            server.close()


async def live_operator_names(tmp: Path) -> set[str]:
    """The operator serving a resource with fleet health, whose summary (two sites) it reads from a
    real nats-server."""
    import nats

    with LocalNatsServer(name="central", store_dir=tmp / "central") as central:
        nc = await nats.connect(central.url)
        try:
            kv = await nc.jetstream().create_key_value(bucket="FLEET_HEALTH")
            await kv.put("summary", h.fleet_summary({"ams": (8, 2, 1), "fra": (3, 0, 0)}))
        finally:
            await nc.close()
        async with ClusterEmulator() as cluster, kmock.Server(cluster):
            api = Api(cluster)
            resource = h.example("registrations-region", "prod")
            for key in ("uid", "generation"):
                resource["metadata"].pop(key)
            resource["spec"]["source"]["url"] = "nats://127.0.0.1:1"
            resource["spec"]["target"] = {"url": central.url, "stream": "REGISTRATION_CENTRAL"}
            for name in ("region-eu-nats", "central-nats"):
                await api.create(h.fake_secret(name, "prod", {"user.creds": b"x", "replicator.creds": b"x"}))
            config = OperatorConfig(status_interval=0.3, resync_interval=30.0, nats_timeout=1.0)
            async with embedded_operator(str(cluster.url), config=config, metrics_port=0) as reconciler:
                await api.create(resource)
                assert reconciler.metrics_server is not None
                port = reconciler.metrics_server.port

                async def served() -> set[str] | None:
                    names = await asyncio.to_thread(scrape, port)
                    return names if "stream_replicator_fleet_health_site_availability_ratio" in names else None

                return set(await wait_for(served, within=10))


@pytest.mark.timeout(90)
async def test_every_queried_metric_is_exported_by_a_live_replicator_or_operator(tmp_path: Path) -> None:
    exported = await live_replicator_names(tmp_path) | await live_operator_names(tmp_path)
    queried = {name: rule["alert"] for rule in rules() for name in metric_names(rule["expr"])}
    queried.update({name: "dashboard" for t in targets(load_dashboard()) for name in metric_names(t["expr"])})
    # The native engine's series need two linked servers: test_operator_native_health.py scrapes them live.
    missing = {name: where for name, where in queried.items() if name not in exported | set(NATIVE_METRIC_NAMES)}
    assert not missing, f"queried but not exported: {missing}"
    assert "stream_replicator_certificate_remaining_seconds" in exported
    assert "stream_replicator_resource_replicas_ready" in exported
