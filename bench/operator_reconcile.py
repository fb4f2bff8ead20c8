"""Operator benchmark: reconcile 100 StreamReplications with every optional child, over HTTP.

    python -m bench.operator_reconcile [--resources 100]

Runs the real operator (kopf and its handlers) against the kmock API emulator on loopback.
Phase 1 creates the resources and waits until every child exists and every status is written;
phase 2 restarts the operator with everything in place and waits until it has re-checked all of
them (the resume pass after an operator upgrade). Target: each phase under 30 s for 100.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from typing import Any

import kmock
from replication_operator.checks import policy
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler
from replication_operator.settings import OperatorConfig

from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

NS = "bench"
# Timers out of the way: this measures reconciliation, not status polling.
CONFIG = OperatorConfig(status_interval=3600, resync_interval=3600, nats_timeout=1)


def resource(index: int) -> dict[str, Any]:
    """Scaled, 3 pods (PodDisruptionBudget), ServiceMonitor, credentials, and fleet health if built."""
    spec: dict[str, Any] = {
        "topic": f"fleet.dc{index}.>",
        "source": {
            "url": "nats://127.0.0.1:1",
            "stream": f"DC{index}",
            "credentialsSecret": {"name": "bench-creds"},
        },
        "target": {"url": "nats://127.0.0.1:1", "stream": f"DC{index}_COPY"},
        "mode": "scaled",
        "replicas": 3,
        "workersPerPod": 4,
        "sampling": {"inspectHeader": "Sender", "age": "5m"},
        "advisory": {"subject": f"advisories.dc{index}"},
        "monitoring": {"serviceMonitor": {"enabled": True}},
    }
    spec["fleetHealth"] = {"schedule": "@every 15m", "output": "s3a://fleet-health/bench"}
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": f"replication-{index:03d}", "namespace": NS},
        "spec": spec,
    }


def children_of(name: str) -> list[tuple[naming.Kind, str]]:
    kinds = [
        (naming.CONFIGMAP, naming.configmap_name(name)),
        (naming.SERVICE, naming.service_name(name)),
        (naming.DEPLOYMENT, naming.deployment_name(name)),
        (naming.PDB, naming.pdb_name(name)),
        (naming.SERVICE_MONITOR, naming.service_monitor_name(name)),
        (naming.SCHEDULED_SPARK_APPLICATION, naming.fleet_health_name(name)),
    ]
    return kinds


async def post(cluster: ClusterEmulator, obj: dict[str, Any]) -> None:
    kind = naming.kind_of(obj)
    async with cluster.post(kind.path(obj["metadata"]["namespace"]), json=obj) as resp:
        assert resp.status < 300, await resp.text()


def all_done(cluster: ClusterEmulator, names: list[str]) -> bool:
    for name in names:
        obj = cluster.peek(naming.STREAM_REPLICATION, NS, name)
        if not obj or (obj.get("status") or {}).get("observedGeneration") != 1:
            return False
        if any(cluster.peek(kind, NS, child) is None for kind, child in children_of(name)):
            return False
    return True


def reconciled(reconciler: Reconciler, count: int) -> bool:
    done = [m for m in reconciler.memory.values() if m.last_full > 0]
    return len(done) >= count


async def run(count: int) -> dict[str, float]:
    names = [resource(i)["metadata"]["name"] for i in range(count)]
    async with ClusterEmulator() as cluster, kmock.Server(cluster):
        await post(
            cluster,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "bench-creds",
                    "namespace": NS,
                    "labels": {policy.USABLE_LABEL: policy.USABLE_VALUE},
                },
                "data": {"user.creds": base64.b64encode(b"bench").decode()},
            },
        )
        async with embedded_operator(str(cluster.url), config=CONFIG):
            start = time.perf_counter()
            for i in range(count):
                await post(cluster, resource(i))
            await wait_for(lambda: all_done(cluster, names), within=120, interval=0.1)
            created = time.perf_counter() - start
        calls_before, writes_before = cluster.calls, cluster.writes

        start = time.perf_counter()
        async with embedded_operator(str(cluster.url), config=CONFIG) as second:
            await wait_for(lambda: reconciled(second, count), within=120, interval=0.05)
            resumed = time.perf_counter() - start
        return {
            "created": created,
            "resumed": resumed,
            "resume_requests": cluster.calls - calls_before,
            "resume_writes": cluster.writes - writes_before,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.operator_reconcile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--resources", type=int, default=100)
    args = parser.parse_args(argv)
    children = len(children_of("x"))
    result = asyncio.run(run(args.resources))
    print(
        f"operator reconcile: {args.resources} StreamReplications x {children} children each "
        f"(kopf {__import__('kopf').__version__}, kmock API emulator over HTTP)"
    )
    print(
        f"  create -> all children and statuses written: {result['created']:.2f} s "
        f"({result['created'] / args.resources * 1000:.1f} ms per resource)"
    )
    print(
        f"  operator restart -> all re-checked:           {result['resumed']:.2f} s "
        f"({int(result['resume_requests'])} API requests, "
        f"{int(result['resume_writes'])} writes incl. kopf's own)"
    )
    target = 30.0
    ok = result["created"] < target and result["resumed"] < target
    print(f"  target < {target:.0f} s each: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
