"""A real Prometheus (/usr/bin/prometheus, Debian package `prometheus`) configured the way the
prometheus-operator configures one from the rendered ServiceMonitors and PrometheusRules.

Targets: each ServiceMonitor endpoint becomes a job (`serviceMonitor/<namespace>/<name>/<index>`)
whose targets are the addresses of the Endpoints of every Service it selects (selection.py), on the
Endpoints port named like the Service port the endpoint names, ready and not-ready addresses alike,
with the target labels the operator gives them: `namespace`, `service`, `pod`, `endpoint` (the port
name), `job` (the Service name), `instance`; `honorLabels` and `path`, `interval`, `scrapeTimeout`
and `relabelings`/`metricRelabelings` carried over. The targets are file_sd files the harness rewrites
as Endpoints change, which Prometheus picks up at once. Rules: the rendered PrometheusRules' groups.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from replicator.demo.local_nats import free_port
from tests.support.system.selection import selections

BINARY = "/usr/bin/prometheus"


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A RelabelConfig of the monitoring.coreos.com API in Prometheus' own spelling."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in rule.items()}


def jobs(monitors: Iterable[dict[str, Any]], services: Iterable[dict[str, Any]],
         endpoints: Iterable[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """job name -> (scrape config without targets, file_sd target groups)."""
    monitors = list(monitors)
    by_service = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in endpoints}
    found: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for monitor in monitors:
        meta = monitor["metadata"]
        for index, endpoint in enumerate(monitor["spec"].get("endpoints") or []):
            job = f"serviceMonitor/{meta.get('namespace')}/{meta['name']}/{index}"
            config: dict[str, Any] = {
                "job_name": job,
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                "scheme": endpoint.get("scheme", "http"),
            }
            if endpoint.get("interval"):
                config["scrape_interval"] = endpoint["interval"]
            if endpoint.get("scrapeTimeout"):
                config["scrape_timeout"] = endpoint["scrapeTimeout"]
            if endpoint.get("relabelings"):
                config["relabel_configs"] = [_relabel(r) for r in endpoint["relabelings"]]
            if endpoint.get("metricRelabelings"):
                config["metric_relabel_configs"] = [_relabel(r) for r in endpoint["metricRelabelings"]]
            found[job] = (config, [])
    for chosen in selections(monitors, [s for s in services]):
        job = f"serviceMonitor/{chosen.monitor}/{chosen.index}"
        namespace, name = chosen.service.split("/")
        for subset in (by_service.get((namespace, name)) or {}).get("subsets") or []:
            port = next((p for p in subset.get("ports") or [] if p.get("name") == chosen.port.get("name")), None)
            if port is None:
                continue
            for address in [*(subset.get("addresses") or []), *(subset.get("notReadyAddresses") or [])]:
                pod = (address.get("targetRef") or {}).get("name", "")
                found[job][1].append({
                    "targets": [f"{address['ip']}:{port['port']}"],
                    "labels": {"namespace": namespace, "service": name, "pod": pod, "job": name,
                               "endpoint": str(port.get("name", ""))},
                })
    return found


class Prometheus:
    """One Prometheus process on a free loopback port, its config and rule files in `root`."""

    def __init__(self, root: Path, evaluation_interval: str = "1s") -> None:
        if not Path(BINARY).exists():
            raise FileNotFoundError(f"{BINARY} is missing: install the Debian package `prometheus` (.ci/run does)")
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.evaluation_interval = evaluation_interval
        self.proc: subprocess.Popen[bytes] | None = None
        self._jobs: dict[str, Any] = {}
        (root / "targets").mkdir(parents=True, exist_ok=True)
        (root / "rules").mkdir(parents=True, exist_ok=True)

    def configure(self, monitors: list[dict[str, Any]], services: list[dict[str, Any]],
                  endpoints: list[dict[str, Any]], rules: list[dict[str, Any]]) -> bool:
        """Write config, rules and targets; True when the config or the rules (not only targets) changed."""
        found = jobs(monitors, services, endpoints)
        for job, (_, groups) in found.items():
            path = self._targets(job)
            text = json.dumps(groups, sort_keys=True)
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(path)
        rules_changed = False
        for rule in rules:
            meta = rule["metadata"]
            path = self.root / "rules" / f"{meta.get('namespace')}-{meta['name']}.yaml"
            text = yaml.safe_dump({"groups": rule["spec"]["groups"]})
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                rules_changed = True
        config = {
            "global": {"scrape_interval": "2s", "scrape_timeout": "1s",
                       "evaluation_interval": self.evaluation_interval},
            "rule_files": [str(self.root / "rules" / "*.yaml")],
            "scrape_configs": [
                {**config, "file_sd_configs": [{"files": [str(self._targets(job))]}]}
                for job, (config, _) in sorted(found.items())
            ],
        }
        changed = config != self._jobs
        if changed:
            (self.root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
            self._jobs = config
        return changed or rules_changed

    def _targets(self, job: str) -> Path:
        return self.root / "targets" / f"{job.replace('/', '_')}.json"

    def check(self) -> None:
        """promtool's verdict on the config and the rule files (a bad rule is a bad seam)."""
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        out = subprocess.run([promtool, "check", "config", str(self.root / "prometheus.yml")],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise AssertionError(f"promtool check config: {out.stdout}{out.stderr}")

    def start(self) -> None:
        self.log = open(self.root / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={self.root / 'prometheus.yml'}", f"--storage.tsdb.path={self.root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
            if self.proc.poll() is not None:
                break
        raise AssertionError(f"Prometheus did not start:\n{self.logs()}")

    def reload(self) -> None:
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self, "log"):
            self.log.close()

    def logs(self) -> str:
        path = self.root / "prometheus.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    # ---- the HTTP API, as Grafana and Alertmanager read it ----
    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise AssertionError(f"Prometheus {path} {params}: {err.code} {err.read()!r}") from None
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]
