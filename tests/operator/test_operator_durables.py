"""Deleting a StreamReplication leaves nothing on the source: the real operator (kopf against the
API emulator) stops the workers, then deletes the durable consumer on a real nats-server, which on
interest or work-queue retention would otherwise hold the stream's messages for ever."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy
from nats.js.errors import NotFoundError
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_fleet_metrics import FAST, NAME, NS
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for


@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_a_deleted_resource_leaves_no_durable_on_the_source(
    mode: str, cluster: ClusterEmulator, api: Api, source_server: LocalNatsServer, source_nc: Client,
    target_server: LocalNatsServer,
) -> None:
    res = h.example(NAME, NS)
    res["spec"].update(engine="replicator", mode=mode, source={"url": source_server.url, "stream": "CMDB"},
                       target={"url": target_server.url})
    res["spec"].pop("workersPerPod", None)
    consumer = parse_spec(res).consumer_name
    for key in ("uid", "generation"):
        res["metadata"].pop(key)
    js = source_nc.jetstream()
    await js.add_stream(name="CMDB", subjects=["cmdb.>"], retention=RetentionPolicy.INTEREST)
    await js.add_consumer("CMDB", ConsumerConfig(durable_name=consumer, ack_policy=AckPolicy.ALL))
    await js.add_consumer("CMDB", ConsumerConfig(durable_name="someone_else", ack_policy=AckPolicy.ALL))
    for i in range(5):
        await js.publish(f"cmdb.n{i}", b"x")  # held by the durables' interest
    async with embedded_operator(str(cluster.url), config=FAST):
        await api.create(res)
        await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, naming.deployment_name(NAME)))
        await wait_for(lambda: "lag" in ((api.get(naming.STREAM_REPLICATION, NS, NAME) or {}).get("status") or {}),
                       within=10)
        await api.delete(naming.STREAM_REPLICATION, NS, NAME)
        await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, NAME) is None, within=20)
        assert api.get(naming.DEPLOYMENT, NS, naming.deployment_name(NAME)) is None
        await wait_for(lambda: "DurableDeleted" in api.reasons(NS, NAME))
    with pytest.raises(NotFoundError):
        await js.consumer_info("CMDB", consumer)
    assert (await js.consumer_info("CMDB", "someone_else")).name == "someone_else"  # not ours: kept


async def _rolled_out(api: Api) -> None:
    """What the Deployment controller reports once every pod runs the current template."""
    deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, naming.deployment_name(NAME)))
    await api.patch(naming.DEPLOYMENT, NS, naming.deployment_name(NAME), {"status": {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 1, "availableReplicas": 1,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}},
        subresource="status")


async def test_a_mode_change_deletes_the_previous_durable_once_rolled_out(
    cluster: ClusterEmulator, api: Api, source_server: LocalNatsServer, source_nc: Client,
    target_server: LocalNatsServer,
) -> None:
    """ordered -> scaled: the ordered durable goes once the scaled pods run (they made the group) and
    no pod of the ordered config is left; status.consumer follows."""
    res = h.example(NAME, NS)
    res["spec"].update(engine="replicator", mode="ordered", source={"url": source_server.url, "stream": "CMDB"},
                       target={"url": target_server.url})
    res["spec"].pop("workersPerPod", None)
    ordered = parse_spec(res).consumer_name
    scaled_spec = dict(res, spec={**res["spec"], "mode": "scaled"})
    group = parse_spec(scaled_spec).consumer_name
    assert group != ordered
    for key in ("uid", "generation"):
        res["metadata"].pop(key)
    js = source_nc.jetstream()
    await js.add_stream(name="CMDB", subjects=["cmdb.>"], retention=RetentionPolicy.INTEREST)
    await js.add_consumer("CMDB", ConsumerConfig(durable_name=ordered, ack_policy=AckPolicy.ALL))

    def status() -> dict[str, object]:
        return (api.get(naming.STREAM_REPLICATION, NS, NAME) or {}).get("status") or {}

    async with embedded_operator(str(cluster.url), config=FAST):
        await api.create(res)
        await wait_for(lambda: status().get("consumer") == ordered, within=10)
        await api.patch(naming.STREAM_REPLICATION, NS, NAME, {"spec": {"mode": "scaled"}})
        await js.add_consumer("CMDB", ConsumerConfig(durable_name=group, ack_policy=AckPolicy.EXPLICIT))
        await asyncio.sleep(1.5)  # the new pods run, but the rollout is not complete: the old durable stays
        assert (await js.consumer_info("CMDB", ordered)).name == ordered
        await _rolled_out(api)
        await wait_for(lambda: status().get("consumer") == group, within=10)
        await wait_for(lambda: "DurableDeleted" in api.reasons(NS, NAME))
    with pytest.raises(NotFoundError):
        await js.consumer_info("CMDB", ordered)
    assert (await js.consumer_info("CMDB", group)).name == group
