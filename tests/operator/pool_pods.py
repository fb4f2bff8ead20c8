"""One pod of a worker pool's Deployment, run as a local process and kept in step with the emulator's
objects as the kubelet keeps a pod: started when the Deployment appears, started again (a new pod)
when its pod template changes, stopped when it is deleted (a foreground deletion released once the
pod is gone). A changed ConfigMap reaches the running pod as the kubelet's sync delivers it: the new
file written into a fresh directory and `..data` swapped over in one rename (SecretVolume), the
process left running. The pod's monitor port is fixed for its life, as a container port is."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from replication_operator.model import naming

from replicator.demo.local_nats import free_port
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.pods import secrets_of, stop
from tests.support.background import BackgroundLoop
from tests.support.kube_emulator import FOREGROUND
from tests.support.secret_volume import SecretVolume


class PoolKubelet(BackgroundLoop):
    def __init__(self, api: Api, namespace: str, pool: str, root: Path) -> None:
        self.api, self.namespace, self.root = api, namespace, root
        self.base = naming.pool_base(pool)
        self.proc: subprocess.Popen[bytes] | None = None
        self.template: str | None = None  # the running pod's template, hashed
        self.data: str | None = None  # the ConfigMap data the pod's volume holds
        self.volume: SecretVolume | None = None
        self.port = 0
        self.starts = 0  # pods started
        self.syncs = 0  # ConfigMap updates delivered into a running pod

    async def __aexit__(self, *exc: object) -> None:
        await self._halt()
        if self.proc is not None:
            await asyncio.to_thread(stop, self.proc)

    @property
    def log(self) -> Path:
        return self.root / f"pod{self.starts}.log"

    async def _loop(self) -> None:
        while True:
            await self._step()
            await asyncio.sleep(0.1)

    def _config(self, deployment: dict[str, Any], configmap: dict[str, Any], pod: Path) -> bytes:
        mounts = {**h.secret_mounts(deployment), **h.config_map_mounts(deployment)}
        config = h.materialise(configmap["data"][naming.CONFIG_KEY], pod,
                               secrets_of(self.api, deployment, self.namespace), mounts)
        for topic in config["topics"].values():
            topic["monitor"] = self.port
        return yaml.safe_dump(config).encode()

    async def _step(self) -> None:
        deployment = self.api.get(naming.DEPLOYMENT, self.namespace, naming.deployment_name(self.base))
        if deployment is None or deployment["metadata"].get("deletionTimestamp"):
            if self.proc is not None:
                await asyncio.to_thread(stop, self.proc)
                self.proc, self.template, self.data = None, None, None
            finalizers = (deployment or {}).get("metadata", {}).get("finalizers") or []
            if deployment is not None and FOREGROUND in finalizers:
                await self.api.patch(naming.DEPLOYMENT, self.namespace, deployment["metadata"]["name"],
                                     {"metadata": {"finalizers": [f for f in finalizers if f != FOREGROUND]}})
            return
        configmap = self.api.get(naming.CONFIGMAP, self.namespace, naming.configmap_name(self.base))
        if configmap is None:
            return
        template = hashlib.sha256(json.dumps(deployment["spec"]["template"], sort_keys=True).encode()).hexdigest()
        data = json.dumps(configmap["data"], sort_keys=True)
        if self.proc is not None and template == self.template:
            if self.proc.poll() is not None:
                raise AssertionError(f"the pod exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if data != self.data and self.volume is not None:  # the kubelet's sync: one `..data` swap
                pod = self.root / f"pod{self.starts}"
                self.volume.update({naming.CONFIG_KEY: self._config(deployment, configmap, pod)})
                self.data = data
                self.syncs += 1
            return
        if self.proc is not None:
            await asyncio.to_thread(stop, self.proc)
        self.starts += 1
        self.port = free_port()
        pod = self.root / f"pod{self.starts}"
        self.volume = SecretVolume(pod / "config-volume", {naming.CONFIG_KEY: self._config(deployment, configmap, pod)})
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = [str(self.volume.path(naming.CONFIG_KEY)) if a == naming.CONFIG_PATH else a for a in container["args"]]
        env = {**os.environ, "SR_INSTANCE": f"{self.base}-pod{self.starts}",
               "POD_NAMESPACE": self.namespace}
        argv = [str(Path(sys.prefix) / "bin" / container["command"][0]), *container["command"][1:], *args]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.template, self.data = template, data
