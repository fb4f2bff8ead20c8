"""The fleet-health summary as the operator's gauges: the real operator (kopf against the API
emulator) reads the job's KV summary from a real nats-server, and `/metrics` is scraped over HTTP."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families
from replication_operator.model import naming
from replication_operator.settings import OperatorConfig

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

NS = "replication"
NAME = "cmdb-city1"
FAST = OperatorConfig(status_interval=0.3, resync_interval=30.0, nats_timeout=2.0)
Series = tuple[str, tuple[tuple[str, str], ...]]
SCHEDULE = ("fleet_health_last_run_timestamp_seconds", "fleet_health_interval_seconds")


def samples(port: int) -> dict[Series, float]:
    """This resource's samples on the operator's /metrics: (name, labels but ours) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert (s.labels.pop("namespace"), s.labels.pop("streamreplication")) == (NS, NAME)
            found[(s.name.removeprefix("stream_replicator_"), tuple(sorted(s.labels.items())))] = s.value
    return found


def fleet_samples(port: int) -> dict[Series, float]:
    """The summary's gauges (`fleet_health_*` but the schedule's two)."""
    return {(name.removeprefix("fleet_health_"), labels): value for (name, labels), value in samples(port).items()
            if name.startswith("fleet_health_") and name not in SCHEDULE}


def expected(fleet: tuple[int, int, int], sites: dict[str, tuple[int, int, int]]) -> dict[Series, float]:
    def counts(name: str, values: tuple[int, int, int], site: tuple[tuple[str, str], ...]) -> dict[Series, float]:
        out: dict[Series, float] = {
            (name + "nodes", tuple(sorted((*site, ("state", state))))): float(v)
            for state, v in zip(("healthy", "timeout", "expired"), values, strict=True)}
        if values[0] + values[1]:
            out[(name + "availability_ratio", site)] = round(values[0] / (values[0] + values[1]), 6)
        return out

    found = counts("", fleet, ())
    for site, values in sites.items():
        found.update(counts("site_", values, (("site", site),)))
    return found


def resource(url: str) -> dict[str, Any]:
    res = h.example(NAME, NS)
    for key in ("uid", "generation"):
        res["metadata"].pop(key)
    res["spec"]["source"] = {"url": "nats://127.0.0.1:1", "stream": "CMDB"}
    res["spec"]["target"] = {"url": url}
    res["spec"].update(sampling={"inspect": "host", "age": "5m"}, advisory={"subject": "adv"},
                       fleetHealth={"schedule": "@every 15m", "output": "/data/fleet"})
    return res


async def test_fleet_summary_becomes_gauges_per_resource_and_site(
    cluster: ClusterEmulator, api: Api, target_server: LocalNatsServer, target_nc: Client
) -> None:
    kv = await target_nc.jetstream().create_key_value(bucket="FLEET_HEALTH")
    first = {"ams": (8, 2, 1), "fra": (3, 0, 0), "edge/west 1": (0, 0, 2)}  # edge: no node reports
    await kv.put("summary", h.fleet_summary(first, run=1))
    async with embedded_operator(str(cluster.url), config=FAST, metrics_port=0) as reconciler:
        assert reconciler.metrics_server is not None
        port = reconciler.metrics_server.port
        await api.create(resource(target_server.url))

        async def shows(want: dict[Series, float]) -> bool:
            return await asyncio.to_thread(fleet_samples, port) == want

        want = expected((11, 2, 3), first)
        assert ("site_availability_ratio", (("site", "edge/west 1"),)) not in want
        await wait_for(lambda: shows(want), within=10)

        async def fleet_status() -> dict[str, Any] | None:  # the gauges can be set before the status patch lands
            return ((api.get(naming.STREAM_REPLICATION, NS, NAME) or {}).get("status") or {}).get("fleet")

        status = await wait_for(fleet_status, within=10)
        assert (status["nodes"], status["healthy"], status["availability"]) == (16, 11, round(11 / 13, 6))

        # The next run: a site left the fleet, another changed; its series follow.
        second = {"ams": (10, 0, 1)}
        await kv.put("summary", h.fleet_summary(second, run=2))
        await wait_for(lambda: shows(expected((10, 0, 1), second)), within=10)

        # Fleet health switched off: the fleet gauges go, the resource's others stay.
        await api.patch(naming.STREAM_REPLICATION, NS, NAME, {"spec": {"fleetHealth": None}})
        await wait_for(lambda: shows({}), within=10)
        left = {name for name, _ in await asyncio.to_thread(samples, port)}
        assert left == {"resource_replicas_desired", "resource_replicas_ready", "resource_copy_loop"}
        await api.patch(naming.STREAM_REPLICATION, NS, NAME, {"spec": resource(target_server.url)["spec"]})
        await wait_for(lambda: shows(expected((10, 0, 1), second)), within=10)

        await api.delete(naming.STREAM_REPLICATION, NS, NAME)

        async def gone() -> bool:  # every series of the resource, the summary's and the others
            return await asyncio.to_thread(samples, port) == {}

        await wait_for(gone, within=10)
