"""A kubelet and endpoints controller standing in for the cluster's, over the emulator.

For every Deployment in the emulator (the chart's operator and the workers the operator builds) it
keeps `spec.replicas` pods running as local processes (processes.py), started again when the pod
template changes or the process exits. Each pod's ConfigMap and Secret volumes are written at their
mount paths, under the pod's own root, in the kubelet's layout (`..data` symlinks, SecretVolume).
Every pod shares the machine's loopback, so what a pod IP gives a real pod, a port of its own, is
given here by a free port per container port: a container that reads its port from its own config
(the worker's `monitor`) gets the port written there, with the pod paths the config names moved under
the pod's root. A pod whose service account token is mounted gets a kubeconfig for the emulator with
`system:serviceaccount:<namespace>:<name>` as its bearer token (the identity the emulator records).

It evaluates each readinessProbe (httpGet) and writes the result back as the Deployment's status
(`replicas`, `readyReplicas`, ...) and as the Endpoints of every Service selecting the pod
(`notReadyAddresses` unless the Service publishes them).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from replicator.demo.local_nats import free_port
from tests.support.background import BackgroundLoop
from tests.support.secret_volume import SecretVolume
from tests.support.system.cluster import SystemCluster
from tests.support.system.processes import Process, argv_of, container_env

WORKER_CONFIG_KEY = "config.yaml"


def _decode(secret: dict[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _with_ports(arg: str, ports: dict[int, int]) -> str:
    """An argument naming a container port (`--metrics-port=8081`, `http://0.0.0.0:8080/healthz`)
    with the port this pod listens on here instead."""
    for port, here in ports.items():
        arg = re.sub(rf"(=|:){port}(?=$|/)", rf"\g<1>{here}", arg)
    return arg


def template_hash(deployment: dict[str, Any]) -> str:
    text = json.dumps(deployment["spec"]["template"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    root: Path
    process: Process
    ports: dict[int, int]  # containerPort -> the port it listens on here
    port_names: dict[str, int]  # container port name -> containerPort
    readiness: dict[str, Any] | None
    ready: bool = False
    restarts: int = 0
    # Secret volumes the kubelet keeps up to date: (volume, its Secret's volume source, what it holds).
    secrets: list[tuple[SecretVolume, dict[str, Any], dict[str, bytes]]] = field(default_factory=list)

    def host_port(self, port: int | str) -> int:
        number = self.port_names[port] if isinstance(port, str) else port
        return self.ports.get(number, number)


@dataclass
class Workload:
    hash: str
    pods: list[Pod] = field(default_factory=list)


class Kubelet(BackgroundLoop):
    def __init__(self, cluster: SystemCluster, root: Path) -> None:
        self.cluster, self.root = cluster, root
        self.workloads: dict[tuple[str, str], Workload] = {}
        self._written: dict[str, Any] = {}
        self.failures: list[str] = []

    async def __aexit__(self, *exc: object) -> None:
        await self._halt()
        await asyncio.gather(*(asyncio.to_thread(p.process.stop) for w in self.workloads.values() for p in w.pods))

    def pods(self, namespace: str, deployment: str) -> list[Pod]:
        workload = self.workloads.get((namespace, deployment))
        return list(workload.pods) if workload else []

    def logs(self) -> str:
        return "\n".join(f"--- {p.namespace}/{p.name}\n{p.process.log(2000)}"
                         for w in self.workloads.values() for p in w.pods)

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
            except (OSError, AssertionError, KeyError, ValueError) as err:  # a failed write: next turn again
                self.failures.append(repr(err))
            await asyncio.sleep(0.5)

    async def step(self) -> None:
        seen = set()
        for deployment in self.cluster.objects_of("apps/v1", "Deployment"):
            meta = deployment["metadata"]
            key = (meta["namespace"], meta["name"])
            seen.add(key)
            if meta.get("deletionTimestamp"):
                continue
            await self._sync(deployment)
        for key in [k for k in self.workloads if k not in seen]:
            await self._stop_all(self.workloads.pop(key))
        for deployment in self.cluster.objects_of("apps/v1", "Deployment"):
            await self._release_foreground(deployment)
        for workload in self.workloads.values():
            for pod in workload.pods:
                self._refresh_secrets(pod)
        await self._probe_all()
        await self._write_status()
        await self._write_endpoints()

    async def _release_foreground(self, deployment: dict[str, Any]) -> None:
        """A foreground deletion completes once its pods are gone (the garbage collector's part)."""
        meta = deployment["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        key = (meta["namespace"], meta["name"])
        if key in self.workloads:
            await self._stop_all(self.workloads.pop(key))
        finalizers = meta.get("finalizers") or []
        if "foregroundDeletion" in finalizers:
            await self.cluster.send("PATCH", self.cluster.url_of(deployment, name=True),
                                    {"metadata": {"finalizers": [f for f in finalizers if f != "foregroundDeletion"]}})

    async def _stop_all(self, workload: Workload) -> None:
        await asyncio.gather(*(asyncio.to_thread(p.process.stop) for p in workload.pods))

    async def _sync(self, deployment: dict[str, Any]) -> None:
        meta = deployment["metadata"]
        key = (meta["namespace"], meta["name"])
        digest = template_hash(deployment)
        workload = self.workloads.get(key)
        if workload is not None and workload.hash != digest:
            await self._stop_all(workload)
            workload = None
        if workload is None:
            workload = self.workloads[key] = Workload(digest)
        want = int(deployment["spec"].get("replicas", 1))
        while len(workload.pods) > want:
            await asyncio.to_thread(workload.pods.pop().process.stop)
        while len(workload.pods) < want:
            pod = self._start(deployment, f"{meta['name']}-{digest[:5]}-{len(workload.pods)}")
            if pod is None:
                return
            workload.pods.append(pod)
        for index, pod in enumerate(workload.pods):
            if not pod.process.running:  # CrashLoop: start it again, counted
                restarted = self._start(deployment, pod.name)
                if restarted is not None:
                    restarted.restarts = pod.restarts + 1
                    workload.pods[index] = restarted

    def _volume_data(self, namespace: str, volume: dict[str, Any]) -> dict[str, bytes] | None:
        if "configMap" in volume:
            name, kind, items = volume["configMap"]["name"], "ConfigMap", volume["configMap"].get("items")
            found = [o for o in self.cluster.objects_of("v1", kind, namespace) if o["metadata"]["name"] == name]
            if not found:
                return None
            data = {k: v.encode() for k, v in (found[0].get("data") or {}).items()}
        elif "secret" in volume:
            name, items = volume["secret"]["secretName"], volume["secret"].get("items")
            found = [o for o in self.cluster.objects_of("v1", "Secret", namespace) if o["metadata"]["name"] == name]
            if not found:
                return None
            data = _decode(found[0])
        else:
            return {}
        if items:
            data = {item["path"]: data[item["key"]] for item in items if item["key"] in data}
        return data

    def _start(self, deployment: dict[str, Any], pod_name: str) -> Pod | None:
        """One pod of the Deployment, or None while a volume's object is missing (ContainerCreating)."""
        namespace = deployment["metadata"]["namespace"]
        template = deployment["spec"]["template"]
        spec = template["spec"]
        (container,) = spec["containers"]
        root = self.root / namespace / pod_name
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        contents: dict[str, tuple[str, dict[str, bytes]]] = {}
        for mount in container.get("volumeMounts") or []:
            data = self._volume_data(namespace, volumes[mount["name"]])
            if data is None:
                return None
            contents[mount["mountPath"]] = (mount["name"], data)
        port_names = {p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if "name" in p}
        ports: dict[int, int] = {}
        rewrite: dict[str, str] = {}
        secrets: list[tuple[SecretVolume, dict[str, Any], dict[str, bytes]]] = []
        for mount_path, (_, data) in contents.items():
            target = root / mount_path.lstrip("/")
            if WORKER_CONFIG_KEY in data and "configMap" in volumes[contents[mount_path][0]]:
                config, ports = self._worker_config(data[WORKER_CONFIG_KEY], root, port_names)
                data = {**data, WORKER_CONFIG_KEY: config}
                rewrite[f"{mount_path}/{WORKER_CONFIG_KEY}"] = str(target / WORKER_CONFIG_KEY)
            if data:
                volume = SecretVolume(target, data)
                source = volumes[contents[mount_path][0]]
                if "secret" in source:
                    secrets.append((volume, source, data))
            else:
                target.mkdir(parents=True, exist_ok=True)
        env = container_env(container, {"name": pod_name, "namespace": namespace})
        if spec.get("automountServiceAccountToken", True) is not False:
            account = spec.get("serviceAccountName", "default")
            env["KUBECONFIG"] = str(self._kubeconfig(root, f"system:serviceaccount:{namespace}:{account}"))
        argv = argv_of(container, rewrite)
        if not ports:  # a container told its ports on its command line (the operator's flags)
            ports = {int(p["containerPort"]): free_port() for p in container.get("ports") or []}
            argv = [_with_ports(arg, ports) for arg in argv]
        process = Process(argv, env, root / "pod.log", cwd=root)
        return Pod(pod_name, namespace, dict(template["metadata"].get("labels") or {}), root, process,
                   ports, port_names, container.get("readinessProbe"), secrets=secrets)

    def _refresh_secrets(self, pod: Pod) -> None:
        """A changed Secret reaches its mounted volume (one atomic `..data` swap), as the kubelet's sync does."""
        for index, (volume, source, held) in enumerate(pod.secrets):
            data = self._volume_data(pod.namespace, source)
            if data is not None and data != held:
                volume.update(data)
                pod.secrets[index] = (volume, source, data)

    def _worker_config(self, text: bytes, root: Path, port_names: dict[str, int]) -> tuple[bytes, dict[int, int]]:
        """The worker's config with its pod paths under the pod's root and its own port."""
        config = yaml.safe_load(text)
        ports: dict[int, int] = {}

        def rewrite(node: Any) -> Any:
            if isinstance(node, dict):
                return {k: rewrite(v) for k, v in node.items()}
            if isinstance(node, list):
                return [rewrite(v) for v in node]
            if isinstance(node, str) and node.startswith(("/etc/", "/var/", "/tmp/")):
                return str(root / node.lstrip("/"))
            return node

        config = rewrite(config)
        for topic in (config.get("topics") or {}).values():
            port = int(topic.get("monitor") or 0)
            if port:
                ports.setdefault(port, free_port())
                topic["monitor"] = ports[port]
        for state_dir in [config.get("state_dir")]:
            if state_dir:
                Path(state_dir).mkdir(parents=True, exist_ok=True)
        return yaml.safe_dump(config).encode(), ports

    def _kubeconfig(self, root: Path, token: str) -> Path:
        path = root / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": str(self.cluster.url).rstrip("/")}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "sa"}}],
        }))
        return path

    async def _probe_all(self) -> None:
        pods = [p for w in self.workloads.values() for p in w.pods]
        results = await asyncio.gather(*(asyncio.to_thread(self._probe, p) for p in pods))
        for pod, ready in zip(pods, results, strict=True):
            pod.ready = ready

    def _probe(self, pod: Pod) -> bool:
        if not pod.process.running:
            return False
        probe = (pod.readiness or {}).get("httpGet")
        if pod.readiness is None:
            return True
        if probe is None:
            raise ValueError(f"unsupported readinessProbe {pod.readiness}")
        url = f"http://127.0.0.1:{pod.host_port(probe['port'])}{probe.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=float(pod.readiness.get("timeoutSeconds", 1))) as resp:
                return 200 <= resp.status < 400
        except OSError:
            return False

    async def _write(self, key: str, method: str, url: str, body: dict[str, Any]) -> None:
        if self._written.get(key) == body:
            return
        await self.cluster.send(method, url, body)
        self._written[key] = body

    async def _write_status(self) -> None:
        for deployment in self.cluster.objects_of("apps/v1", "Deployment"):
            meta = deployment["metadata"]
            pods = self.pods(meta["namespace"], meta["name"])
            ready = sum(p.ready for p in pods)
            status = {"observedGeneration": meta.get("generation", 1), "replicas": len(pods),
                      "updatedReplicas": len(pods), "readyReplicas": ready, "availableReplicas": ready,
                      "unavailableReplicas": len(pods) - ready}
            await self._write(f"status/{meta['namespace']}/{meta['name']}", "PATCH",
                              self.cluster.url_of(deployment, name=True, subresource="status"), {"status": status})

    async def _write_endpoints(self) -> None:
        pods = [p for w in self.workloads.values() for p in w.pods]
        for service in self.cluster.objects_of("v1", "Service"):
            meta, spec = service["metadata"], service["spec"]
            selector = spec.get("selector") or {}
            chosen = [p for p in pods if p.namespace == meta["namespace"] and selector
                      and selector.items() <= p.labels.items()]
            publish = bool(spec.get("publishNotReadyAddresses"))
            subsets = []
            for pod in chosen:
                ports = []
                for port in spec.get("ports") or []:
                    target = port.get("targetPort", port["port"])
                    if isinstance(target, str) and target not in pod.port_names:
                        continue
                    ports.append({"name": port.get("name", ""), "port": pod.host_port(target),
                                  "protocol": port.get("protocol", "TCP")})
                address = {"ip": "127.0.0.1", "targetRef": {"kind": "Pod", "name": pod.name,
                                                            "namespace": pod.namespace}}
                ready = pod.ready or publish
                subsets.append({"addresses" if ready else "notReadyAddresses": [address], "ports": ports})
            endpoints = {"apiVersion": "v1", "kind": "Endpoints",
                         "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                                      "labels": dict(meta.get("labels") or {})},
                         "subsets": subsets}
            key = f"endpoints/{meta['namespace']}/{meta['name']}"
            if self._written.get(key) != endpoints:
                await self.cluster.apply(endpoints)
                self._written[key] = endpoints
