"""A worker pool end to end: three StreamReplications in one pool, through the real operator over the
API emulator, their pool's Deployment run as a process (pool_pods.py) against two real NATS servers.

While all copy, one member is deleted, one added and one changed, each a reload of its own: the
operator rewrites the pool's ConfigMap alone (the Deployment does not roll), the kubelet stand-in
swaps the mounted file, the worker reloads it and restarts only the changed member's copier.
Asserted on what the servers, the worker's log and its metrics show: the same pod and process
throughout, the unchanged members' copiers and consumers never recreated, every message on the
targets once and in order; the removed member's copies a gapless prefix of its source, and its durable
consumer deleted once the pool's workers had the grace period to stop it. A member
whose pods would differ is refused with its condition, the pool untouched.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import make_stream
from tests.operator.helpers import Api
from tests.operator.pool_pods import PoolKubelet
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
)
from tests.support.kube_emulator import wait_for

NS = "cities"
POOL = "region"
RATE = 150  # messages a second into each member's stream


def member(name: str, source: str, target: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": naming.API_VERSION, "kind": naming.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"topic": f"{name}.>", "pool": POOL, "source": {"url": source, "stream": name.upper()},
                 "target": {"url": target, "stream": name.upper()}, **spec},
    }


def replicator(name: str) -> str:
    return f"{NS}_{name}"  # the default replicator name, the `name` label of its metrics


def bound(log: str, name: str) -> int:
    """How often a copier of this replication started (its worker bound to the durable)."""
    return sum(1 for line in log.splitlines() if f"{replicator(name)}_" in line and "bound to" in line)


def copied(exposition: str, name: str) -> float:
    return metric(exposition, "stream_replicator_copied_msgs_total", name=replicator(name)) or 0.0


async def consumer_created(nc: Client, name: str) -> str:
    return str((await nc.jetstream().consumer_info(name.upper(), f"{NS}_{name}")).created)


async def report(config: Path) -> list[list[str]]:
    """`stream-replicator report` on the pod's config file: its table's rows, cell by cell."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "replicator", "report", "--config", str(config),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    lines = [line for line in out.decode().splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def condition(api: Api, name: str, kind: str) -> dict[str, Any] | None:
    body = api.get(naming.STREAM_REPLICATION, NS, name) or {}
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


async def test_a_pool_of_three_loses_and_duplicates_nothing_as_members_come_and_go(
        api: Api, operator: Reconciler, tmp_path: Path, source_server: LocalNatsServer,
        target_server: LocalNatsServer, source_nc: Client, target_nc: Client) -> None:
    names = ("a", "b", "c", "d")
    for name in names:
        await make_stream(source_nc, name.upper(), [f"{name}.>"])
    publishers = {n: ContinuousPublisher(source_nc, rate=RATE, subject=f"{n}.m{{i}}").start() for n in names}
    base = naming.pool_base(POOL)
    try:
        for name in ("a", "b", "c"):
            await api.create(member(name, source_server.url, target_server.url))
        async with PoolKubelet(api, NS, POOL, tmp_path) as kubelet:
            for name in ("a", "b", "c"):
                assert await wait_count(target_nc, name.upper(), 100, 60) is not None, log_text(kubelet.log)
            assert kubelet.starts == 1
            pid = kubelet.proc.pid if kubelet.proc else None
            deployment = api.get(naming.DEPLOYMENT, NS, base)
            assert deployment is not None
            template = deployment["spec"]["template"]
            created = {n: await consumer_created(source_nc, n) for n in ("a", "b")}
            before = scrape(kubelet.port)
            counted = {n: copied(before, n) for n in ("a", "b")}
            assert all(counted.values()), before[:2000]

            # One removed and one added while all copy.
            mark = log_size(kubelet.log)
            await api.delete(naming.STREAM_REPLICATION, NS, "c")
            assert await wait_log(kubelet.log, "config reloaded: removed c; 2 unchanged", 60, mark), \
                log_text(kubelet.log, mark)
            assert await wait_log(kubelet.log, "c stopped for the reload", 60, mark), log_text(kubelet.log, mark)
            await api.create(member("d", source_server.url, target_server.url))
            assert await wait_log(kubelet.log, "config reloaded: added d; 2 unchanged", 60, mark), \
                log_text(kubelet.log, mark)
            assert await wait_count(target_nc, "D", 100, 60) is not None, log_text(kubelet.log, mark)
            await asyncio.sleep(1.0)  # the unchanged keep copying through the reloads
            after = scrape(kubelet.port)
            assert kubelet.starts == 1 and kubelet.proc is not None and kubelet.proc.pid == pid  # never restarted
            assert kubelet.syncs == 2  # each change of the ConfigMap reached the running pod
            deployment = api.get(naming.DEPLOYMENT, NS, base)
            assert deployment is not None and deployment["spec"]["template"] == template  # the pods did not roll
            for name in ("a", "b"):  # the same consumers, no new copier, counters going on
                assert await consumer_created(source_nc, name) == created[name]
                assert copied(after, name) > counted[name]
                assert bound(log_text(kubelet.log), name) == 1
            assert f'name="{replicator("c")}"' not in after  # its series went with it
            configmap = api.get(naming.CONFIGMAP, NS, naming.configmap_name(base))
            assert configmap is not None and "\n  d:\n" in configmap["data"][naming.CONFIG_KEY]
            assert [r["name"] for r in configmap["metadata"]["ownerReferences"]] == ["a", "b", "d"]

            # One changed: it alone restarts, on its own durable, with its new settings.
            created["d"] = await consumer_created(source_nc, "d")
            mark = log_size(kubelet.log)
            await api.patch(naming.STREAM_REPLICATION, NS, "b", {"spec": {"maxAge": "1h"}})
            assert await wait_log(kubelet.log, "config reloaded: changed b; 2 unchanged", 60, mark), \
                log_text(kubelet.log, mark)
            assert await wait_log(kubelet.log, "bound to", 30, mark), log_text(kubelet.log, mark)
            assert bound(log_text(kubelet.log, mark), "b") == 1
            for name in ("a", "d"):
                assert bound(log_text(kubelet.log, mark), name) == 0
                assert await consumer_created(source_nc, name) == created[name]
            assert kubelet.starts == 1 and kubelet.proc.pid == pid and kubelet.syncs == 3

            # A member whose pods would differ is refused; the pool is left as it was.
            versions = {k.kind: (api.get(k, NS, n) or {})["metadata"]["resourceVersion"] for k, n in
                        ((naming.DEPLOYMENT, base), (naming.CONFIGMAP, naming.configmap_name(base)))}
            await api.create(member("e", source_server.url, target_server.url, replicas=2))
            ready = await wait_for(lambda: (c := condition(api, "e", "Ready")) and c["status"] == "False"
                                   and c["reason"] == "PoolMismatch" and c, within=20)
            assert "'a'" in ready["message"] and "spec.replicas" in ready["message"], ready
            stalled = condition(api, "e", "Stalled")
            assert stalled is not None and stalled["status"] == "True" and stalled["reason"] == "PoolMismatch"
            assert "PoolMismatch" in api.reasons(NS, "e")
            await asyncio.sleep(1.0)
            assert versions == {k.kind: (api.get(k, NS, n) or {})["metadata"]["resourceVersion"] for k, n in
                                ((naming.DEPLOYMENT, base), (naming.CONFIGMAP, naming.configmap_name(base)))}
            assert api.get(naming.DEPLOYMENT, NS, "e") is None  # nor a Deployment of its own
            assert kubelet.starts == 1

            for publisher in publishers.values():
                await publisher.stop()
            totals = {n: len(p.acked) for n, p in publishers.items()}
            for name in ("a", "b", "d"):
                assert await wait_count(target_nc, name.upper(), totals[name], 60) is not None, log_text(kubelet.log)
            assert kubelet.starts == 1 and kubelet.proc.pid == pid
            assert kubelet.volume is not None
            rows = await report(kubelet.volume.path(naming.CONFIG_KEY))
            assert {r[0]: (r[3], r[4]) for r in rows} == {n: (replicator(n), "0") for n in ("a", "b", "d")}, rows
    finally:
        for publisher in publishers.values():
            if publisher._task is not None and not publisher._task.done():
                await publisher.stop()
    for name in ("a", "b", "d"):
        outcome = compare(name, await read_stream(source_nc, name.upper()),
                          await read_stream(target_nc, name.upper()), recover_s=None)
        assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
    # The removed member stopped cleanly: its copies are the source's first messages, once each, in order.
    target = await read_stream(target_nc, "C")
    upto = max(m.source_seq for m in target)
    source = [m for m in await read_stream(source_nc, "C") if m.seq <= upto]
    outcome = compare("c", source, target, recover_s=None)
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
    assert 100 <= len(target) < len(await read_stream(source_nc, "C"))  # it copied, then stopped
    # Its finalizer waited the grace period (FAST: 2 s) for the pool's workers, then deleted its durable.
    assert await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, "c") is None, within=30)
    names = [c.name for c in await source_nc.jetstream().consumers_info("C")]
    assert f"{NS}_c" not in names, names
