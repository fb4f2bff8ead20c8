"""A pooled worker (`replicate --reload`) follows its ConfigMap while every replication copies.

The config file lives in a volume laid out as the kubelet lays out a ConfigMap (`..data` swapped in
one rename). Real servers, the real console entry point as a process; what is asserted is what the
servers and the monitor show: every copy on the target once and in order, the connections and the
durable consumers of the replications the reload left alone (the same server connection ids, the
same consumer creation time), their counters never reset, and a removed replication's series gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.copier.helpers import make_stream
from tests.support.faults import (
    ContinuousPublisher,
    compare,
    log_size,
    log_text,
    metric,
    read_stream,
    scrape,
    wait_count,
    wait_log,
    wait_metric,
)
from tests.support.secret_volume import SecretVolume

POOL = ("p0", "p1", "p2", "p3")


def pool_config(source: str, target: str, port: int, names: list[str],
                overrides: dict[str, dict[str, Any]] | None = None) -> bytes:
    topics = {n: {"topic": f"{n}.>", "source_url": source, "target_url": target, "name": f"sr_{n}",
                  "monitor": port, "max_in_flight": 500, **(overrides or {}).get(n, {})} for n in names}
    return yaml.safe_dump({"topics": topics}).encode()


def connections(server: LocalNatsServer) -> dict[str, int]:
    """The server's client connections: name -> connection id."""
    url = f"http://127.0.0.1:{server.monitor_port}/connz?limit=1000"
    with urllib.request.urlopen(url, timeout=5) as resp:
        conns = json.loads(resp.read())["connections"] or []
    return {c["name"]: c["cid"] for c in conns if c.get("name")}


def workers_of(conns: dict[str, int], name: str) -> dict[str, int]:
    return {k: v for k, v in conns.items() if k == f"sr_{name}_0"}


async def consumer_created(nc: Client, name: str) -> str:
    info = await nc.jetstream().consumer_info(name.upper(), f"sr_{name}")
    return str(info.created)


def copied(port: int, name: str) -> float:
    return metric(scrape(port), "stream_replicator_copied_msgs_total", name=f"sr_{name}", worker=f"sr_{name}_0") or 0


async def test_reload_adds_removes_and_changes_replications_while_all_copy(
        tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
        target_nc: Client) -> None:
    for name in POOL:
        await make_stream(source_nc, name.upper(), [f"{name}.>"])
    port = free_port()
    volume = SecretVolume(tmp_path / "config", {"config.yaml": pool_config(
        source_server.url, target_server.url, port, ["p0", "p1", "p2"])})
    log = tmp_path / "worker.log"
    proc = subprocess.Popen([sys.executable, "-m", "replicator", "replicate", "--config",
                             str(volume.path("config.yaml")), "--reload"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    publishers = {n: ContinuousPublisher(source_nc, rate=600, subject=f"{n}.m{{i}}").start() for n in POOL}
    try:
        for name in ("p0", "p1", "p2"):
            assert await wait_count(target_nc, name.upper(), 100, 30) is not None, log_text(log)
        before_src, before_dst = connections(source_server), connections(target_server)
        created = {n: await consumer_created(source_nc, n) for n in ("p0", "p1")}
        counted = {n: copied(port, n) for n in ("p0", "p1")}
        assert all(counted.values())
        pending = (await source_nc.jetstream().consumer_info("P1", "sr_p1")).config.max_ack_pending

        # One removed and one added while all copy.
        mark = log_size(log)
        volume.update({"config.yaml": pool_config(source_server.url, target_server.url, port,
                                                  ["p0", "p1", "p3"])})
        assert await wait_log(log, "config reloaded: added p3; removed p2; 2 unchanged", 30, mark), log_text(log)
        assert await wait_log(log, "p2 stopped for the reload", 30, mark), log_text(log)
        assert await wait_count(target_nc, "P3", 100, 30) is not None, log_text(log)
        await asyncio.sleep(1.0)  # the unchanged keep copying through the reload
        after_src, after_dst = connections(source_server), connections(target_server)
        for name in ("p0", "p1"):  # never restarted: the same connections and consumer, counters going on
            assert workers_of(after_src, name) == workers_of(before_src, name) != {}
            assert workers_of(after_dst, name) == workers_of(before_dst, name) != {}
            assert await consumer_created(source_nc, name) == created[name]
            assert copied(port, name) > counted[name]
        assert not workers_of(after_src, "p2") and not workers_of(after_dst, "p2")
        assert "sr_p2" not in scrape(port)  # its series went with it
        assert log_text(log, mark).count("bound to") == 1  # p3's, nobody else's

        # One changed: it restarts cleanly with its new settings; the other goes on untouched.
        counted = {n: copied(port, n) for n in ("p0", "p3")}
        mark = log_size(log)
        volume.update({"config.yaml": pool_config(source_server.url, target_server.url, port,
                                                  ["p0", "p1", "p3"], {"p1": {"max_in_flight": 200}})})
        assert await wait_log(log, "config reloaded: changed p1; 2 unchanged", 30, mark), log_text(log)
        assert await wait_log(log, "sr_p1_0 bound to", 30, mark), log_text(log)
        changed_src = connections(source_server)
        assert workers_of(changed_src, "p0") == workers_of(before_src, "p0")
        assert workers_of(changed_src, "p1") != workers_of(before_src, "p1")
        assert await consumer_created(source_nc, "p0") == created["p0"]
        assert copied(port, "p0") > counted["p0"] and copied(port, "p3") > counted["p3"]
        info = await source_nc.jetstream().consumer_info("P1", "sr_p1")
        assert info.config.max_ack_pending < pending  # placed again for the smaller max_in_flight
    finally:
        for publisher in publishers.values():
            await publisher.stop()
    try:
        totals = {n: len(p.acked) for n, p in publishers.items()}
        for name in ("p0", "p1", "p3"):
            assert await wait_count(target_nc, name.upper(), totals[name], 60) is not None, log_text(log)
            assert await wait_metric(port, "stream_replicator_copied_msgs_total", float(totals[name]), 30,
                                     name=f"sr_{name}", worker=f"sr_{name}_0")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_text(log)
    for name in ("p0", "p1", "p3"):
        outcome = compare(name, await read_stream(source_nc, name.upper()), await read_stream(target_nc, name.upper()),
                          recover_s=None)
        assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
    # The removed replication stopped cleanly: what it acknowledged on the source is exactly what
    # it copied, once each and in order, and nothing was left in flight.
    upto = (await source_nc.jetstream().consumer_info("P2", "sr_p2")).ack_floor.stream_seq
    target = await read_stream(target_nc, "P2")
    assert len(target) == upto > 0
    source = [m for m in await read_stream(source_nc, "P2") if m.seq <= upto]
    outcome = compare("p2", source, target, recover_s=None)
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
    assert (await source_nc.jetstream().consumer_info("P2", "sr_p2")).num_ack_pending == 0
