"""Fleet health marks a node whose silence lies inside a blind spot `unknown`, not `timeout`.

Advisories on a real stream, the job in local Spark, and what its readers see: the nodes, sites and
fleet tables, and the KV summary. The replicator's `gap` and `blind_spot` advisories on the same
subject are read, not counted as malformed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from replicator.demo.local_nats import LocalNatsServer
from replicator.fleet_health.connection import connect
from replicator.fleet_health.job import run_fleet_health
from tests.fleet_health.helpers import publish, read_summary

T0 = 1_700_000_000


def age_advisory(n: int, event: str, value: str, ts: int, seen: int, replicator: str = "dc1") -> bytes:
    return json.dumps({"$schema": "https://choria.io/schemas/sr/v1/age_advisory.json", "event_id": f"e{n}",
                       "event": event, "inspect": "sender", "value": value, "age": ts - seen, "seen": T0 + seen,
                       "replicator": replicator, "topic": "acme.cmdb", "timestamp": T0 + ts}).encode()


def other(kind: str, **fields: Any) -> bytes:
    return json.dumps({"$schema": f"https://stream-replicator.io/schemas/sr/v1/{kind}_advisory.json",
                       "event_id": f"{kind}-1", "event": kind, "replicator": "dc1", "topic": "acme.cmdb",
                       "timestamp": T0 + 2000, **fields}).encode()


MESSAGES = [
    age_advisory(1, "new", "n1", 0, 0),
    age_advisory(2, "new", "n2", 0, 0),
    age_advisory(3, "new", "n3", 0, 0),
    age_advisory(4, "new", "n1", 0, 0, replicator="dc2"),
    age_advisory(5, "timeout", "n1", 600, 300),  # judged inside dc1's blind spot (400..900): unknown
    age_advisory(6, "timeout", "n2", 1200, 900),  # judged after it: a real timeout
    age_advisory(7, "timeout", "n1", 600, 300, replicator="dc2"),  # dc2 was watching: a timeout
    other("gap", value="CMDB", stream="CMDB", first_seq=10, last_seq=19, count=10, reasons={"limits": 10},
          **{"from": T0 + 400.0, "until": T0 + 800.0}),
    other("blind_spot", value="acme.cmdb", **{"from": T0 + 400.5, "until": T0 + 900.25}),
]


async def fill(url: str) -> None:
    nc = await connect(url, name="fill")
    try:
        await nc.jetstream().add_stream(name="ADVISORIES", subjects=["sr.advisory.>"])
        await publish(nc, MESSAGES)
    finally:
        await nc.close()


def test_a_timeout_inside_a_blind_spot_is_unknown(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory,
                                                 tmp_path: Path) -> None:
    server = LocalNatsServer(name="fleet-blind", store_dir=tmp_path_factory.mktemp("js")).start()
    try:
        asyncio.run(fill(server.url))
        result = run_fleet_health(server.url, "ADVISORIES", str(tmp_path / "out"), now=T0 + 3000, spark=spark)
        assert result.malformed == 0 and result.read == len(MESSAGES)
        rows = spark.read.parquet(str(tmp_path / "out" / "nodes")).collect()
        nodes = {(r.replicator, r.value): r.state for r in rows}
        assert nodes == {("dc1", "n1"): "unknown", ("dc1", "n2"): "timeout", ("dc1", "n3"): "healthy",
                         ("dc2", "n1"): "timeout"}
        sites = {s["replicator"]: s for s in result.sites}
        assert (sites["dc1"]["unknown"], sites["dc1"]["timeout"], sites["dc1"]["healthy"]) == (1, 1, 1)
        assert sites["dc1"]["availability"] == pytest.approx(0.5)  # unknown is not judged either way
        assert (result.fleet["unknown"], result.fleet["timeout"]) == (1, 2)
        summary = asyncio.run(read_summary(server.url))
        assert summary["fleet"]["unknown"] == 1
        assert {s["replicator"]: s["unknown"] for s in summary["sites"]} == {"dc1": 1, "dc2": 0}
        # A later run with nothing new keeps the blind spot (stored with its run).
        again = run_fleet_health(server.url, "ADVISORIES", str(tmp_path / "out"), now=T0 + 4000, spark=spark)
        assert again.fleet["unknown"] == 1
    finally:
        server.close()
