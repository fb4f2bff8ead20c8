"""The Spark operator's part for the fleet-health job: a ScheduledSparkApplication's run started as
its driver would be, on demand (the test plays the schedule, so "the job is late" is simply a run
that does not come).

The driver's `mainApplicationFile` (`local:///app/...`, the image's copy of this repository) runs
from the repository through the venv's `spark-submit` in local mode, with the template's
`arguments` and `sparkConf`; the driver's Secrets are written at their paths in the kubelet's
layout, and every pod path the arguments name is moved under the run's own root, as the worker's
config is by the kubelet stand-in. `deps.packages` would need Maven downloads: refused.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from replicator.fleet_health.standalone import loopback_env, submit_command
from tests.support.secret_volume import SecretVolume
from tests.support.system.cluster import SystemCluster
from tests.support.system.kubelet import _decode

REPO = Path(__file__).resolve().parents[3]
IMAGE_APP = "local:///app/"


class SparkRuns:
    def __init__(self, cluster: SystemCluster, root: Path) -> None:
        self.cluster, self.root = cluster, root
        self.runs = 0

    def _application(self, namespace: str, name: str) -> dict[str, Any]:
        for app in self.cluster.objects_of("sparkoperator.k8s.io/v1beta2", "ScheduledSparkApplication", namespace):
            if app["metadata"]["name"] == name:
                return app
        raise AssertionError(f"no ScheduledSparkApplication {namespace}/{name}")

    def command(self, namespace: str, name: str) -> tuple[list[str], Path]:
        """spark-submit's command line for one run of the application, and the run's root."""
        template = self._application(namespace, name)["spec"]["template"]
        if (template.get("deps") or {}).get("packages"):
            raise AssertionError(f"{name}: deps.packages need Maven downloads, which the system test cannot make")
        self.runs += 1
        root = self.root / namespace / f"{name}-{self.runs}"
        for secret in template["driver"].get("secrets") or []:
            found = [s for s in self.cluster.objects_of("v1", "Secret", namespace)
                     if s["metadata"]["name"] == secret["name"]]
            assert found, f"the driver's Secret {secret['name']} is missing"
            SecretVolume(root / secret["path"].lstrip("/"), _decode(found[0]))

        def here(value: str) -> str:
            return str(root / value.lstrip("/")) if value.startswith(("/etc/", "/var/", "/tmp/")) else value

        app = template["mainApplicationFile"]
        assert app.startswith(IMAGE_APP), app
        conf = {k: here(str(v)) for k, v in (template.get("sparkConf") or {}).items()}
        conf.update({f"spark.hadoop.{k}": str(v) for k, v in (template.get("hadoopConf") or {}).items()})
        arguments = [here(a) for a in template.get("arguments") or []]
        return submit_command("local[2]", arguments, conf, app=REPO / app.removeprefix(IMAGE_APP)), root

    async def run(self, namespace: str, name: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """One run of the driver, to its end."""
        argv, root = self.command(namespace, name)
        root.mkdir(parents=True, exist_ok=True)
        return await asyncio.to_thread(subprocess.run, argv, env=loopback_env(), capture_output=True, text=True,
                                       timeout=timeout, check=False, cwd=root)
