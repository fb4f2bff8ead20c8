"""Run what the operator's Deployment runs, as local processes: the container's command, arguments
and environment, the config file written from the ConfigMap, the mounted Secrets' files written from
their objects, every pod path moved under a temporary directory. `Kubelet` does it continuously for
one Deployment (start, roll on a config change, stop and release a foreground deletion)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from replication_operator.model import naming

from replicator.demo.local_nats import free_port
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.support.background import BackgroundLoop
from tests.support.kube_emulator import FOREGROUND


def pod_process(
    deployment: dict[str, Any],
    configmap: dict[str, Any],
    root: Path,
    pod_name: str,
    secrets: dict[str, dict[str, bytes]],
    namespace: str,
) -> tuple[list[str], dict[str, str], int]:
    """argv, environment and monitor port of the Deployment's container, runnable here."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {**h.secret_mounts(deployment), **h.config_map_mounts(deployment)}
    config = h.materialise(configmap["data"][naming.CONFIG_KEY], root, secrets, mounts)
    port = free_port()
    for topic in config["topics"].values():
        topic["monitor"] = port
    config_path = root / naming.CONFIG_PATH.lstrip("/")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config))

    executable = Path(sys.prefix) / "bin" / container["command"][0]
    args = [str(config_path) if a == naming.CONFIG_PATH else a for a in container["args"]]
    env = dict(os.environ)
    for var in container["env"]:
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[var["name"]] = {"metadata.name": pod_name, "metadata.namespace": namespace}.get(
            field, var.get("value", ""))
    return [str(executable), *container["command"][1:], *args], env, port


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def secrets_of(api: Api, deployment: dict[str, Any], namespace: str) -> dict[str, dict[str, bytes]]:
    found = {}
    for secret_name in h.secret_mounts(deployment).values():
        secret = api.get(naming.SECRET, namespace, secret_name) or {}
        found[secret_name] = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    for map_name in h.config_map_mounts(deployment).values():  # mounted the same way (a CA bundle)
        config_map = api.get(naming.CONFIGMAP, namespace, map_name) or {}
        found[map_name] = {k: str(v).encode() for k, v in (config_map.get("data") or {}).items()}
    return found


class Kubelet(BackgroundLoop):
    """One pod for one Deployment, kept in step with the emulator's objects: started when the
    Deployment appears, restarted when its config hash changes, stopped when it is deleted; a
    foreground deletion is released (as the garbage collector would) only once the pod is gone."""

    def __init__(self, api: Api, namespace: str, name: str, root: Path) -> None:
        self.api, self.namespace, self.name, self.root = api, namespace, name, root
        self.proc: subprocess.Popen[bytes] | None = None
        self.config_hash: str | None = None
        self.starts = 0
        self.exit_codes: list[int] = []

    async def __aexit__(self, *exc: object) -> None:
        await self._halt()
        await self._stop()

    def log(self) -> str:
        path = self.root / f"pod{self.starts}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def _stop(self) -> None:
        if self.proc is not None:
            self.exit_codes.append(await asyncio.to_thread(stop, self.proc))
            self.proc = None

    async def _loop(self) -> None:
        while True:
            await self._step()
            await asyncio.sleep(0.1)

    async def _step(self) -> None:
        deployment = self.api.get(naming.DEPLOYMENT, self.namespace, naming.deployment_name(self.name))
        if deployment is None or deployment["metadata"].get("deletionTimestamp"):
            await self._stop()
            finalizers = (deployment or {}).get("metadata", {}).get("finalizers") or []
            if FOREGROUND in finalizers:
                await self.api.patch(naming.DEPLOYMENT, self.namespace, deployment["metadata"]["name"],  # type: ignore[index]
                                     {"metadata": {"finalizers": [f for f in finalizers if f != FOREGROUND]}})
            return
        configmap = self.api.get(naming.CONFIGMAP, self.namespace, naming.configmap_name(self.name))
        if configmap is None:
            return
        digest = deployment["spec"]["template"]["metadata"]["annotations"][naming.ANNOTATION_CONFIG_HASH]
        if self.proc is not None and digest == self.config_hash:
            if self.proc.poll() is not None:
                raise AssertionError(f"the pod exited with {self.proc.returncode}:\n{self.log()}")
            return
        await self._stop()
        self.starts += 1
        argv, env, _ = pod_process(deployment, configmap, self.root / f"pod{self.starts}",
                                   f"{self.name}-pod", secrets_of(self.api, deployment, self.namespace),
                                   self.namespace)
        with open(self.root / f"pod{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.config_hash = digest
