"""status.lag, status.lastActive and status.fleet, read from real nats-server processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec
from replication_operator.nats import connection, probes
from replication_operator.nats.connection import Auth, NatsStatusError
from replication_operator.reconcile.reconciler import Reconciler

from replicator.copier.loss import LOSS_NOTE, Note
from replicator.demo.local_nats import LocalNatsServer
from replicator.transport.streams import set_consumer_note
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.support import certs, nats_jwt
from tests.support.kube_emulator import wait_for

NS = "replication"


def _resource(source_url: str, target_url: str = "nats://127.0.0.1:1", **spec: Any) -> dict[str, Any]:
    resource = h.example("cmdb-city1", NS)
    resource["spec"]["source"] = {"url": source_url, "stream": "CMDB"}
    resource["spec"]["target"]["url"] = target_url
    resource["spec"].update(spec)
    return resource


async def _consumer_with_backlog(nc: Client, durable: str, published: int = 10, acked: int = 4) -> None:
    js = nc.jetstream()
    await js.add_stream(name="CMDB", subjects=["acme.cmdb.>"])
    for i in range(published):
        await js.publish(f"acme.cmdb.node{i}", b"{}")
    await js.add_consumer("CMDB", ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT))
    sub = await js.pull_subscribe_bind(durable, "CMDB")
    for msg in await sub.fetch(acked, timeout=5):
        await msg.ack_sync()


def _summary(nodes: int = 1200) -> bytes:
    return json.dumps(
        {
            "$schema": "stream-replicator/v1/fleet_health_summary",
            "stream": "ADVISORIES",
            "run": 3,
            "last_run": 1767225600,
            "last_sequence": 99,
            "fleet": {
                "sites": 4,
                "nodes": nodes,
                "healthy": 1100,
                "timeout": 60,
                "expired": 40,
                "availability": 0.948276,
            },
            "sites": [],
            "advisories": 99,
            "duplicates": 0,
            "malformed": 0,
        }
    ).encode()


async def test_lag_and_last_active_of_the_ordered_durable(source_server: LocalNatsServer, source_nc: Client) -> None:
    spec = parse_spec(_resource(source_server.url))
    await _consumer_with_backlog(source_nc, spec.consumer_name)
    fields = await probes.read_consumer(spec, Auth(), 5)
    assert fields["lag"] == 6
    assert fields["lastActive"].endswith("Z")


async def test_scaled_mode_reads_the_queue_group_and_finds_the_stream(
    source_server: LocalNatsServer, source_nc: Client
) -> None:
    resource = _resource(source_server.url, mode="scaled", replicas=2, workersPerPod=2)
    resource["spec"]["source"].pop("stream")
    spec = parse_spec(resource)
    assert spec.consumer_name == "replication_cmdb-city1_grp"
    await _consumer_with_backlog(source_nc, spec.consumer_name, published=5, acked=5)
    assert (await probes.read_consumer(spec, Auth(), 5))["lag"] == 0


async def test_missing_consumer_and_unreachable_server_are_explained(source_server: LocalNatsServer) -> None:
    spec = parse_spec(_resource(source_server.url))
    with pytest.raises(NatsStatusError, match="not found"):
        await probes.read_consumer(spec, Auth(), 5)
    spec = parse_spec(_resource("nats://user:secret@127.0.0.1:1"))
    with pytest.raises(NatsStatusError, match="cannot connect") as err:
        await probes.read_consumer(spec, Auth(), 5)
    assert "secret" not in str(err.value)


async def test_fleet_summary_from_the_kv_bucket(target_server: LocalNatsServer, target_nc: Client) -> None:
    resource = _resource(
        "nats://127.0.0.1:1",
        target_server.url,
        sampling={"inspect": "host", "age": "5m"},
        advisory={"subject": "adv"},
        fleetHealth={"schedule": "@every 15m", "output": "/data/fleet"},
    )
    spec = parse_spec(resource)
    with pytest.raises(NatsStatusError, match="no fleet summary yet"):
        await probes.read_fleet(spec, Auth(), 5)
    kv = await target_nc.jetstream().create_key_value(bucket="FLEET_HEALTH")
    await kv.put("summary", _summary())
    fleet = (await probes.read_fleet(spec, Auth(), 5)).status
    assert fleet == {
        "nodes": 1200,
        "healthy": 1100,
        "timeout": 60,
        "expired": 40,
        "availability": 0.948276,
        "lastRun": "2026-01-01T00:00:00Z",
    }


def test_fleet_fields_accept_flat_totals_and_reject_garbage() -> None:
    flat = probes.fleet_fields(b'{"nodes": 3, "healthy": 2, "last_run": "2026-01-01T00:00:00Z"}')
    assert flat == {"nodes": 3, "healthy": 2, "lastRun": "2026-01-01T00:00:00Z"}
    with pytest.raises(NatsStatusError):
        probes.fleet_fields(b"not json")
    sites = probes.fleet_sites(json.dumps({"sites": [
        {"replicator": "ams", "nodes": 2, "healthy": 1, "timeout": 1, "expired": 0, "availability": 0.5},
        {"nodes": 1}, "not a row", {"replicator": "fra", "healthy": True, "availability": None}]}).encode())
    assert sites == ({"site": "ams", "nodes": 2, "healthy": 1, "timeout": 1, "expired": 0, "availability": 0.5},
                     {"site": "fra"})
    assert probes.fleet_sites(b'{"fleet": {"nodes": 1}}') == ()


async def test_mutual_tls_material_comes_from_the_secret(tmp_path: Path) -> None:
    ca = certs.CertificateAuthority.create()
    server_files = certs.write_server(ca, tmp_path, "nats")
    client = ca.issue("replicator", client=True)
    with LocalNatsServer(name="tls", extra_config=certs.server_tls_block(server_files), scheme="tls") as server:
        secret = {
            "ca.crt": certs.cert_pem(ca.cert),
            "tls.crt": certs.cert_pem(client.cert),
            "tls.key": certs.key_pem(client.key),
        }
        resource = _resource(server.url)
        resource["spec"]["source"]["tlsSecret"] = "city1-tls"
        spec = parse_spec(resource)
        auth = connection.auth_from_secrets(spec.source, {"city1-tls": secret})
        nc = await nats.connect(server.url, tls=auth.material().ssl_context)
        try:
            await _consumer_with_backlog(nc, spec.consumer_name, published=3, acked=1)
        finally:
            await nc.close()
        assert (await probes.read_consumer(spec, auth, 5))["lag"] == 2
        without_cert = Auth(ca=secret["ca.crt"])
        with pytest.raises(NatsStatusError, match="cannot connect"):
            await probes.read_consumer(spec, without_cert, 5)


async def test_operator_reports_lag_and_fleet_in_status(
    api: Api,
    operator: Reconciler,
    source_server: LocalNatsServer,
    source_nc: Client,
    target_server: LocalNatsServer,
    target_nc: Client,
) -> None:
    resource = _resource(
        source_server.url,
        target_server.url,
        sampling={"inspect": "host", "age": "5m"},
        advisory={"subject": "adv"},
        fleetHealth={"schedule": "@every 15m", "output": "/data/fleet"},
    )
    for key in ("uid", "generation"):
        resource["metadata"].pop(key)
    await _consumer_with_backlog(source_nc, "replication_cmdb-city1")
    kv = await target_nc.jetstream().create_key_value(bucket="FLEET_HEALTH")
    await kv.put("summary", _summary(nodes=1500))
    await api.create(resource)

    def status() -> dict[str, Any]:
        return dict((api.get(naming.STREAM_REPLICATION, NS, "cmdb-city1") or {}).get("status") or {})

    await wait_for(lambda: status().get("lag") == 6 and status().get("fleet", {}).get("nodes") == 1500, within=5)
    assert status()["lastActive"].endswith("Z")
    # One more message: the next tick sees it.
    await source_nc.jetstream().publish("acme.cmdb.late", b"{}")
    await wait_for(lambda: status().get("lag") == 7, within=5)
    # A worker noted a loss at the source on its durable (`copier/loss.py`): the status shows it.
    note = Note(3299, {"limits": 3299}, 1702, 5000, "limits", "2026-11-28T22:40:01Z")
    await set_consumer_note(source_nc.jetstream(), "CMDB", "replication_cmdb-city1", LOSS_NOTE, note.text())
    await wait_for(lambda: status().get("sourceLoss") == {"lost": 3299, "byReason": {"limits": 3299}, "first": 1702,
                                                          "last": 5000, "at": "2026-11-28T22:40:01Z"}, within=5)


async def test_credentials_come_from_the_secret(tmp_path: Path) -> None:
    """An operator-mode server accepts only the .creds file held in the Secret."""
    auth = nats_jwt.Decentralised.create()
    creds = auth.write_creds(tmp_path / "user.creds")
    with LocalNatsServer(name="creds", extra_config=auth.server_config()) as server:
        resource = _resource(server.url)
        resource["spec"]["source"]["credentialsSecret"] = {"name": "city1-nats"}
        spec = parse_spec(resource)
        nc = await nats.connect(server.url, user_credentials=str(creds))
        try:
            await _consumer_with_backlog(nc, spec.consumer_name, published=4, acked=1)
        finally:
            await nc.close()
        from_secret = connection.auth_from_secrets(spec.source, {"city1-nats": {"user.creds": creds.read_bytes()}})
        assert (await probes.read_consumer(spec, from_secret, 5))["lag"] == 3
        with pytest.raises(NatsStatusError) as err:
            await probes.read_consumer(spec, Auth(), 5)
        assert "SEED" not in str(err.value) and "eyJ" not in str(err.value)
