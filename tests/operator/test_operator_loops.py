"""Copy loops in the resource's status: a worker's loop note on its source consumer (written by
`replicator/copier/loops.py`) becomes the `CopyLoop` condition, a Warning event and the operator's
`stream_replicator_resource_copy_loop` gauge. The real operator (kopf against the API emulator)
reads the consumer from a real nats-server."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec

from replicator.copier.loops import LOOP_NOTE
from replicator.demo.local_nats import LocalNatsServer
from replicator.transport.streams import set_consumer_note
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_fleet_metrics import FAST, NAME, NS, samples
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

REFUSED = "refused: source sequence 1 is a copy from target stream CMDB (instance Ab3dE9xY), not copied back"


async def test_a_refused_loop_becomes_the_copyloop_condition_and_gauge(
    cluster: ClusterEmulator, api: Api, source_server: LocalNatsServer, source_nc: Client,
    target_server: LocalNatsServer,
) -> None:
    res = h.example(NAME, NS)
    res["spec"]["source"] = {"url": source_server.url, "stream": "CMDB"}
    res["spec"]["target"] = {"url": target_server.url}
    consumer = parse_spec(res).consumer_name
    for key in ("uid", "generation"):
        res["metadata"].pop(key)
    js = source_nc.jetstream()
    await js.add_stream(name="CMDB", subjects=["cmdb.>"])
    await js.add_consumer("CMDB", ConsumerConfig(durable_name=consumer, ack_policy=AckPolicy.ALL))
    async with embedded_operator(str(cluster.url), config=FAST, metrics_port=0) as reconciler:
        assert reconciler.metrics_server is not None
        port = reconciler.metrics_server.port
        await api.create(res)

        async def loop_condition(status: str) -> dict[str, Any] | None:
            body = api.get(naming.STREAM_REPLICATION, NS, NAME) or {}
            conds = [c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "CopyLoop"]
            return conds[0] if conds and conds[0]["status"] == status else None

        async def gauge(value: float) -> bool:
            found = await asyncio.to_thread(samples, port)
            return found.get(("resource_copy_loop", ())) == value

        await wait_for(lambda: gauge(0.0), within=10)
        assert await loop_condition("True") is None and await loop_condition("False") is None  # none noted yet

        await set_consumer_note(js, "CMDB", consumer, f"{LOOP_NOTE}.w_0", REFUSED)
        cond = await wait_for(lambda: loop_condition("True"), within=10)
        assert cond["reason"] == "LoopRefused" and cond["message"].startswith(REFUSED)
        assert "target.subjectPrefix" in cond["message"] and "activeActive" in cond["message"]
        await wait_for(lambda: gauge(1.0), within=10)
        await wait_for(lambda: "LoopRefused" in api.reasons(NS, NAME), within=10)

        await set_consumer_note(js, "CMDB", consumer, f"{LOOP_NOTE}.w_0", "skipped 12 (active-active)")
        cond = await wait_for(lambda: loop_condition("False"), within=10)
        assert (cond["reason"], cond["message"]) == ("LoopsSkipped", "skipped 12 (active-active)")
        await wait_for(lambda: gauge(0.0), within=10)
