"""`spec.heartbeats`: in the CRD (both copies), parsed, and built into the worker's `heartbeats`
config, which a worker runs against a real server."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client
from nats.js.api import StreamConfig
from replication_operator.build.worker_config import build_worker_config
from replication_operator.model.spec import parse_spec

from replicator.config import Profile, parse_config
from replicator.demo.local_nats import LocalNatsServer
from replicator.service.process import ReplicatorProcess
from tests.operator import helpers as h
from tests.support.faults import read_stream

ROOT = Path(__file__).resolve().parents[2]


def with_heartbeats(**heartbeats: Any) -> dict[str, Any]:
    resource = copy.deepcopy(h.example("orders-eu"))
    resource["spec"]["heartbeats"] = heartbeats
    return resource


def test_both_crd_copies_are_identical_and_take_heartbeats() -> None:
    chart = ROOT / "helm" / "stream-replicator" / "crds" / "streamreplications.streamreplicator.io.yaml"
    assert chart.read_text() == h.CRD_PATH.read_text()
    assert h.cr_errors(with_heartbeats(subjects=[{"subject": "a._monitor", "interval": "5s",
                                                  "headers": {"x": "y"}}])) == []
    assert any("subjects" in e for e in h.cr_errors(with_heartbeats(subjects=[])))
    assert any("does not match" in e for e in h.cr_errors(with_heartbeats(subjects=[{"subject": "a.>"}])))
    assert any("cluster" in e for e in h.cr_errors(with_heartbeats(cluster="elsewhere", subjects=[{"subject": "a"}])))


@pytest.mark.parametrize(("replicas", "asked", "elected"), [(3, None, True), (1, None, False), (3, False, False)])
def test_heartbeats_in_the_worker_config(replicas: int, asked: bool | None, elected: bool) -> None:
    resource = with_heartbeats(cluster="target", subjects=[{"subject": "a._monitor"},
                                                           {"subject": "b._monitor", "interval": "1m"}],
                               **({} if asked is None else {"leaderElection": asked}))
    resource["spec"]["replicas"] = replicas
    spec = parse_spec(resource)
    config = build_worker_config(spec)
    assert config.model.heartbeats is not None and config.model.heartbeats.leader_election is elected
    written = yaml.safe_load(config.text)
    assert written["name"] == spec.replicator_name
    assert written["heartbeats"] == {
        "url": spec.target.url, "interval": "10s", "leader_election": elected, "headers": {},
        "subjects": [{"subject": "a._monitor", "headers": {}}, {"subject": "b._monitor", "headers": {},
                                                                 "interval": "1m"}],
    }
    assert "heartbeats" not in yaml.safe_load(build_worker_config(parse_spec(h.example("orders-eu") | {"spec": {
        **h.example("orders-eu")["spec"], "heartbeats": None}})).text)


async def test_the_worker_runs_the_heartbeats_it_was_given(source_server: LocalNatsServer, source_nc: Client,
                                                           target_server: LocalNatsServer) -> None:
    resource = with_heartbeats(interval="200ms", headers={"site": "eu"}, subjects=[{"subject": "orders.eu._monitor"}])
    resource["spec"]["source"]["url"] = source_server.url
    resource["spec"]["target"]["url"] = target_server.url
    resource["spec"]["target"]["create"] = True
    resource["spec"].pop("start")
    await source_nc.jetstream().add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
    config = yaml.safe_load(build_worker_config(parse_spec(resource)).text)
    config["state_dir"] = "/tmp"
    parsed = parse_config(config, "configmap")
    process = ReplicatorProcess(parsed, [Profile(parsed, next(iter(parsed.topics)))])
    task = asyncio.ensure_future(process.run())
    try:
        for _ in range(100):  # elected first (three replicas asked), then beating, then copied
            if process.heartbeats and process.heartbeats.published["orders.eu._monitor"] >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        process.stop()
        await asyncio.wait_for(task, 30)
    beats = [m for m in await read_stream(source_nc, "ORDERS") if m.subject == "orders.eu._monitor"]
    assert len(beats) >= 2
    assert {(m.headers["site"], m.headers["Choria-SR-Subject"]) for m in beats} == {("eu", "orders.eu._monitor")}
    assert process.heartbeats is not None and process.heartbeats.election is not None
    assert process.heartbeats.election.key == f"SR_{parse_spec(resource).replicator_name}_HB"
