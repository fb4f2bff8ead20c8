"""The topology the product exists for, end to end: cities -> region -> centre.

Two cities hold a `CHORIA_REGISTRATION` stream each, same name, same subjects; one replicator
process per city copies it into the region's `CHORIA_REGISTRATION` (ordered, unsampled, no subject
prefix, one config for both cities but the URLs). One process copies the region to the centre,
sampled by the JSON field `sender` at a longer `age`, announcing senders on the region's advisory
stream; one more copies those advisories up to the centre. Four real servers, four processes.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from replicator.copier.provenance import PROVENANCE, parse_provenance
from replicator.demo.local_nats import LocalNatsServer
from replicator.sampling.advisories import SCHEMA_ID
from tests.copier.helpers import make_stream, spawn, stop, write_config
from tests.copier.test_fan_in import writer_of
from tests.support.faults import compare, read_stream, wait_count

REG = "CHORIA_REGISTRATION"
ADV = "CHORIA_REGISTRATION_ADVISORIES"
SENDERS, ROUNDS = 30, 5  # per city


@pytest.fixture
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalNatsServer]]:
    servers = {name: LocalNatsServer(name=name, store_dir=tmp_path_factory.mktemp(f"{name}-js")).start()
               for name in ("city1", "city2", "region", "centre")}
    yield servers
    for server in servers.values():
        server.close()


def tree_config(s: dict[str, LocalNatsServer]) -> dict[str, Any]:
    def city(name: str) -> dict[str, Any]:  # identical for every city but the URLs
        return {"topic": "choria.registration.>", "source_url": s[name].url, "target_url": s["region"].url,
                "source_stream": REG, "name": "registration_region"}

    return {"topics": {
        "city1": city("city1"),
        "city2": city("city2"),
        "centre": {"topic": "choria.registration.>", "source_url": s["region"].url, "target_url": s["centre"].url,
                   "source_stream": REG, "name": "registration_centre", "inspect": "sender", "age": "1h",
                   "advisory": {"target": "choria.advisories.registration", "cluster": "source", "age": "30m"}},
        "advisories": {"topic": "choria.advisories.>", "source_url": s["region"].url, "target_url": s["centre"].url,
                       "source_stream": ADV, "name": "advisories_centre"},
    }}


async def publish_round(ncs: dict[str, Client], rnd: int) -> None:
    for city, nc in ncs.items():
        js = nc.jetstream()
        for n in range(SENDERS):
            body = {"sender": f"{city}-n{n:02d}", "round": rnd, "city": city}
            await js.publish(f"choria.registration.shard{n % 3}", json.dumps(body).encode())


def _logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.log")))


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_cities_region_centre(tmp_path: Path, tree: dict[str, LocalNatsServer]) -> None:
    ncs = {name: await nats.connect(server.url) for name, server in tree.items()}
    procs = []
    try:
        for city in ("city1", "city2"):
            await make_stream(ncs[city], REG, ["choria.registration.>"])
        await make_stream(ncs["region"], ADV, ["choria.advisories.>"])
        cities = {c: ncs[c] for c in ("city1", "city2")}
        for rnd in range(2):
            await publish_round(cities, rnd)
        config = write_config(tmp_path / "sr.yaml", tree_config(tree))
        procs = [spawn(config, hop, log_path=tmp_path / f"{hop}.log")
                 for hop in ("city1", "city2", "centre", "advisories")]
        for rnd in range(2, ROUNDS):
            await publish_round(cities, rnd)
            await asyncio.sleep(0.3)
        total = 2 * SENDERS * ROUNDS
        assert await wait_count(ncs["region"], REG, total, 60) is not None, _logs(tmp_path)
        assert await wait_count(ncs["centre"], REG, 2 * SENDERS, 60) is not None, _logs(tmp_path)
        assert await wait_count(ncs["centre"], ADV, 2 * SENDERS, 60) is not None, _logs(tmp_path)
        await asyncio.sleep(2.0)  # a late duplicate would land now
    finally:
        codes = [stop(p) for p in procs]
    try:
        assert codes == [0, 0, 0, 0]
        region = await read_stream(ncs["region"], REG)
        assert len(region) == total
        for city in ("city1", "city2"):  # complete and in order per city
            writer = await writer_of(ncs[city], "registration_region", REG)
            outcome = compare(f"tree: {city} -> region", await read_stream(ncs[city], REG), region,
                              recover_s=None, writer=writer)
            assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
            mine = [m for m in region if m.writer == writer]
            assert len(mine) == SENDERS * ROUNDS and {json.loads(m.data)["city"] for m in mine} == {city}
        centre = await read_stream(ncs["centre"], REG)
        per_sender = collections.Counter(json.loads(m.data)["sender"] for m in centre)
        senders = {f"{c}-n{n:02d}" for c in ("city1", "city2") for n in range(SENDERS)}
        assert set(per_sender) == senders and set(per_sender.values()) == {1}, per_sender
        region_writer = await writer_of(ncs["region"], "registration_centre", REG)
        for m in centre:  # provenance names the hop it came from: the region's stream, that replicator
            prov = parse_provenance(m.headers[PROVENANCE])
            assert prov is not None and (prov.stream, prov.name, prov.writer) == (
                REG, "registration_centre", region_writer)
            assert region[prov.seq - 1].data == m.data
        advisories = await read_stream(ncs["centre"], ADV)
        docs = [json.loads(m.data) for m in advisories]
        assert sorted(d["value"] for d in docs) == sorted(senders)
        assert {(d["$schema"], d["event"], d["replicator"]) for d in docs} == {
            (SCHEMA_ID, "new", "registration_centre")}
        adv_writer = await writer_of(ncs["region"], "advisories_centre", ADV)
        assert all(m.writer == adv_writer for m in advisories)
    finally:
        for nc in ncs.values():
            await nc.close()
