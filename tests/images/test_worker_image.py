"""The `worker` image, run as Kubernetes runs it: the replicator as the operator's Deployment runs it,
and the operator as the Helm chart's Deployment runs it (against the API emulator)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import kmock
import yaml
from nats.aio.client import Client
from replication_operator.build.children import BuildOptions, build_children
from replication_operator.model import images, naming
from replication_operator.model.spec import parse_spec

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.helm.helm_chart_support import find, render
from tests.images.conftest import TAGS
from tests.images.support import Podman, pod_options
from tests.operator.helpers import Api, child_of
from tests.support.kube_emulator import ClusterEmulator, wait_for

NS = "images"
MESSAGES = 40


def _get(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except OSError:
        return None


def _field_env(container: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """A container's environment, downward-API fields filled in from `fields`."""
    env = {}
    for var in container.get("env") or []:
        field = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        env[var["name"]] = fields[field] if field else var.get("value", "")
    return env


def _copied(text: str) -> float:
    return sum(float(v) for v in re.findall(r"^stream_replicator_copied_msgs(?:_total)?\{[^}]*\} (\S+)$", text, re.M))


async def test_worker_replicates_as_its_deployment_runs_it(
    podman: Podman,
    worker_image: str,
    tmp_path: Path,
    source_server: LocalNatsServer,
    target_server: LocalNatsServer,
    source_nc: Client,
    target_nc: Client,
) -> None:
    """Read-only root, user 10001, no capabilities, the ConfigMap mounted read-only, emptyDirs for
    /tmp and the state: the copy arrives in order, /metrics counts it, SIGTERM stops it cleanly."""
    port = free_port()
    resource = {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": "cmdb", "namespace": NS, "uid": "uid-cmdb", "generation": 1},
        "spec": {
            "topic": "acme.cmdb.>",
            "source": {"url": source_server.url, "stream": "CMDB"},
            "target": {"url": target_server.url, "stream": "CMDB_COPY"},
            "monitoring": {"port": port},
        },
    }
    children = build_children(parse_spec(resource), BuildOptions(worker_image=worker_image))
    deployment = child_of(children, naming.DEPLOYMENT)
    configmap = child_of(children, naming.CONFIGMAP)
    assert deployment and configmap
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == worker_image

    config_dir = tmp_path / "config"
    config_dir.mkdir()
    for key, text in configmap["data"].items():
        (config_dir / key).write_text(text)
    options = pod_options(pod, container)
    assert (options.user, options.read_only, options.cap_drop_all) == ("10001:10001", True, True)
    options.mounts.append((config_dir, naming.CONFIG_DIR, True))
    options.env = _field_env(container, {"metadata.name": "cmdb-0", "metadata.namespace": NS})

    source_js = source_nc.jetstream()
    await source_js.add_stream(name="CMDB", subjects=["acme.cmdb.>"])
    for i in range(MESSAGES):
        await source_js.publish(f"acme.cmdb.node{i % 5}", json.dumps({"n": i}).encode())

    with podman.start(worker_image, container["args"], options, tmp_path / "worker.log") as worker:

        async def copied() -> bool:
            assert worker.running(), worker.output()[-4000:]
            try:
                info = await target_nc.jetstream().stream_info("CMDB_COPY")
            except Exception:
                return False
            return bool(info.state.messages == MESSAGES)

        await wait_for(copied, within=60, interval=0.2)
        metrics = await wait_for(
            lambda: (r := _get(f"http://127.0.0.1:{port}/metrics")) and _copied(r[1]) == MESSAGES and r[1],
            within=20,
            interval=0.2,
        )
        assert "stream_replicator_received_msgs" in metrics
        assert (await wait_for(lambda: _get(f"http://127.0.0.1:{port}/readyz"), within=20, interval=0.2))[0] == 200
        # Who runs it, and on what: the pod's user, a root filesystem nobody can write.
        ids = worker.exec("python", "-c", "import os; print(os.getuid(), os.getgid())")
        assert ids.stdout.split() == ["10001", "10001"], ids.stderr
        write = worker.exec("python", "-c", "open('/home/replicator/x', 'w')")
        assert write.returncode != 0 and "Read-only file system" in write.stderr
        worker.terminate()
        code = await asyncio.to_thread(worker.wait, 30)
        assert code == 0, worker.output()[-4000:]

    target_js = target_nc.jetstream()
    for seq in (1, MESSAGES):
        msg = await target_js.get_msg("CMDB_COPY", seq=seq)
        assert json.loads(msg.data) == {"n": seq - 1}
        assert (msg.headers or {}).get("Stream-Replicator-Source", "").startswith(f"CMDB {seq} ")
    (consumer,) = [c async for c in _consumers(source_js, "CMDB")]
    assert consumer.num_pending == 0 and consumer.num_ack_pending == 0


async def _consumers(js: Any, stream: str) -> Any:
    for info in await js.consumers_info(stream):
        yield info


async def test_operator_in_the_worker_image_reconciles(podman: Podman, worker_image: str, tmp_path: Path) -> None:
    """The chart's operator Deployment (defaults, standalone) in the image, against the API emulator:
    it creates the Deployment of a StreamReplication, with the worker image `make image` tagged."""
    health = free_port()
    objects = render({"peering": {"enabled": False}, "operator": {"healthPort": health}})
    (deployment,) = find(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The chart's defaults, the operator's defaults and `make image` name the same images.
    assert container["image"] == worker_image == TAGS["worker"] == images.DEFAULT_WORKER_IMAGE
    env = _field_env(container, {"metadata.name": "operator-0", "metadata.namespace": "ops"})
    assert env[images.WORKER_IMAGE_ENV] == TAGS["worker"] and env[images.SPARK_IMAGE_ENV] == TAGS["spark"]
    # Loopback only here: the chart's 0.0.0.0 listener would open the port on every interface.
    args = [a.replace("0.0.0.0", "127.0.0.1") for a in container["args"]]
    assert f"--liveness=http://127.0.0.1:{health}/healthz" in args and "--standalone" in args

    async with ClusterEmulator() as cluster, kmock.Server(cluster):
        kube = tmp_path / "kube"
        kube.mkdir()
        (kube / "config").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": {"server": str(cluster.url)}}],
                    "users": [{"name": "operator", "user": {"token": "not-a-secret"}}],
                    "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "operator"}}],
                }
            )
        )
        options = pod_options(pod, container)
        assert (options.user, options.read_only, options.entrypoint) == (
            "10001:10001",
            True,
            ["stream-replicator-operator"],
        )
        options.mounts.append((kube, "/etc/kube", True))
        options.env = {**env, "KUBECONFIG": "/etc/kube/config"}
        assert options.tmpfs == ["/tmp"]  # the chart's emptyDir: the only writable place
        with podman.start(worker_image, args, options, tmp_path / "operator.log") as operator:
            await wait_for(
                lambda: _get(f"http://127.0.0.1:{health}/healthz") or not operator.running(), within=60, interval=0.2
            )
            assert operator.running(), operator.output()[-4000:]
            api = Api(cluster)
            await api.create(
                {
                    "apiVersion": naming.API_VERSION,
                    "kind": naming.KIND,
                    "metadata": {"name": "telemetry", "namespace": NS},
                    "spec": {
                        "topic": "acme.telemetry.>",
                        # Nothing listens there: the operator's status checks fail, on loopback.
                        "source": {"url": f"nats://127.0.0.1:{free_port()}", "stream": "TELEMETRY"},
                        "target": {"url": f"nats://127.0.0.1:{free_port()}"},
                    },
                }
            )
            made = await wait_for(
                lambda: api.get(naming.DEPLOYMENT, NS, naming.deployment_name("telemetry")), within=60, interval=0.2
            )
            assert made["spec"]["template"]["spec"]["containers"][0]["image"] == worker_image
            assert await wait_for(lambda: api.get(naming.CONFIGMAP, NS, naming.configmap_name("telemetry")), within=10)
            operator.terminate()
            code = await asyncio.to_thread(operator.wait, 30)
            assert code == 0, operator.output()[-4000:]
        assert "Handler 'apply-create' succeeded" in operator.output()
