"""The product installed from its chart and watched, as a cluster would run it.

`installed(...)` renders the chart with the real Helm engine (monitoring on, plus the values a user
sets for short scrape intervals and alert `for:` durations), loads the CRDs and rendered objects
into the API emulator, and starts the kubelet (kubelet.py), which runs the operator as its rendered
Deployment says and then every worker Deployment the operator builds. A real Prometheus scrapes
what the rendered ServiceMonitors select among the Services and Endpoints in the emulator, with the
rendered PrometheusRule as its rules; its targets follow the Endpoints as they change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kmock
import yaml

from replicator.demo.local_nats import free_port
from tests.support.system.cluster import SystemCluster
from tests.support.system.kubelet import Kubelet
from tests.support.system.prometheus import Prometheus

REPO = Path(__file__).resolve().parents[3]
CHART_DIR = REPO / "helm" / "stream-replicator"
DASHBOARD = CHART_DIR / "dashboards" / "stream-replicator.json"
RELEASE, NAMESPACE = "sr", "ops"
SCRAPE = "1s"


def monitoring_values(operator_env: dict[str, str] | None = None, **alerts: str | int) -> dict[str, Any]:
    """What a user sets to watch the product, with short intervals and `for:` durations
    (`operator_env`: more of the operator's settings, through the chart's `operator.extraEnv`)."""
    env = {"STREAM_REPLICATOR_STATUS_INTERVAL": "1", **(operator_env or {})}
    return {
        "metrics": {
            "serviceMonitor": {"enabled": True, "interval": SCRAPE, "scrapeTimeout": "900ms"},
            "prometheusRule": {
                "enabled": True, "lagGrowingFor": "5s", "lagMinMessages": 20, "lagGrowingWindow": "20s",
                "stuckFor": "5s", "stuckWindow": "20s", "notReadyFor": "5s", "poisonWindow": "20s",
                "advisoryErrorsWindow": "20s", "certificateExpiringFor": "5s", "leaderMissingFor": "5s",
                "fleetHealthNotRunFor": "5s", **alerts,
            },
        },
        "operator": {
            # Free ports: every "pod" here shares the machine's network namespace.
            "healthPort": free_port(),
            "metricsPort": free_port(),
            "extraEnv": [{"name": k, "value": v} for k, v in env.items()],
        },
    }


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in extra.items():
        result[key] = merge(result[key], value) if isinstance(value, dict) and isinstance(result.get(key), dict) \
            else value
    return result


def render(values: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs, rendered objects) from the real Helm engine."""
    chart = helm.Chart.load(CHART_DIR)
    crds = [d for crd in chart.crds for d in yaml.safe_load_all(crd["data"]) if d]
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = [d for path, text in sorted(rendered.items()) if path.endswith(".yaml")
               for d in yaml.safe_load_all(text) if d]
    return crds, objects


@dataclass
class System:
    cluster: SystemCluster
    kubelet: Kubelet
    prometheus: Prometheus
    objects: list[dict[str, Any]]
    # Applied to every object Prometheus is configured from: a seam broken on purpose.
    tamper: Callable[[dict[str, Any]], None] | None = None

    def seen(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        """The objects of a kind as the prometheus-operator sees them (tampered with, if a test says)."""
        found = self.cluster.objects_of(api_version, kind)
        if self.tamper is not None:
            for obj in found:
                self.tamper(obj)
        return found

    def sync_prometheus(self) -> None:
        seen = self.seen
        changed = self.prometheus.configure(
            seen("monitoring.coreos.com/v1", "ServiceMonitor"), seen("v1", "Service"), seen("v1", "Endpoints"),
            seen("monitoring.coreos.com/v1", "PrometheusRule"))
        if changed and self.prometheus.proc is not None:
            self.prometheus.reload()

    async def until(self, predicate: Callable[[], Any], within: float, what: str, interval: float = 1.0) -> Any:
        """Poll `predicate` (Prometheus or the emulator) until truthy; fail naming `what`."""
        deadline = time.monotonic() + within
        last: Any = None
        while time.monotonic() < deadline:
            last = await asyncio.to_thread(predicate)
            if last:
                return last
            await asyncio.sleep(interval)
        raise AssertionError(f"{what}: not within {within:.0f} s (last: {last!r})\n{self.kubelet.failures[-3:]}\n"
                             f"{self.kubelet.logs()[-6000:]}")

    def resource(self, namespace: str, name: str) -> dict[str, Any] | None:
        for obj in self.cluster.objects_of("streamreplicator.io/v1alpha1", "StreamReplication", namespace):
            if obj["metadata"]["name"] == name:
                return obj
        return None


@contextlib.asynccontextmanager
async def installed(root: Path, values: dict[str, Any], namespaces: list[str]) -> AsyncIterator[System]:
    crds, objects = render(values)
    async with SystemCluster() as cluster, kmock.Server(cluster):
        for namespace in [NAMESPACE, *namespaces]:
            await cluster.send("POST", "/api/v1/namespaces",
                               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await cluster.install(crds, NAMESPACE)
        await cluster.install(objects, NAMESPACE)
        prometheus = Prometheus(root / "prometheus")
        async with Kubelet(cluster, root / "pods") as kubelet:
            system = System(cluster, kubelet, prometheus, objects)
            system.sync_prometheus()
            await asyncio.to_thread(prometheus.check)
            await asyncio.to_thread(prometheus.start)

            async def follow() -> None:
                while True:
                    await asyncio.to_thread(system.sync_prometheus)
                    await asyncio.sleep(0.5)

            follower = asyncio.create_task(follow())
            try:
                yield system
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
                await asyncio.to_thread(prometheus.stop)
