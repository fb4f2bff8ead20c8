"""End to end without a cluster: run what the operator's Deployment runs, against two real NATS servers.

The ConfigMap and Deployment come from the real operator (over the API emulator); `pods.py` runs
the container's command locally as a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from replication_operator.model import naming
from replication_operator.nats import connection
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.pods import pod_process, running, secrets_of
from tests.support import certs, nats_jwt
from tests.support.kube_emulator import wait_for

NS = "e2e"
MESSAGES = 50


def _resource(name: str, source: str, target: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "topic": "acme.cmdb.>",
            "source": {"url": source, "stream": "CMDB"},
            "target": {"url": target, "stream": "CMDB_COPY"},
            **spec,
        },
    }


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


async def _run_pods(
    api: Api,
    name: str,
    pods: int,
    tmp_path: Path,
    source_js: Any,
    target_nc: Client,
    consumer: str,
    ordered: bool,
) -> None:
    """Run the Deployment's container `pods` times, Secrets included, and check the copy."""
    deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, name))
    configmap = await wait_for(lambda: api.get(naming.CONFIGMAP, NS, f"{name}-config"))
    secrets = secrets_of(api, deployment, NS)

    await source_js.add_stream(name="CMDB", subjects=["acme.cmdb.>"])
    for i in range(MESSAGES):
        await source_js.publish(f"acme.cmdb.node{i % 7}", f'{{"n": {i}}}'.encode())

    with contextlib.ExitStack() as stack:
        ports, procs = [], []
        for index in range(pods):
            argv, env, port = pod_process(
                deployment, configmap, tmp_path / f"pod{index}", f"{name}-pod-{index}", secrets, NS
            )
            procs.append(stack.enter_context(running(argv, env, tmp_path / f"pod{index}.log")))
            ports.append(port)

        async def copied() -> bool:
            for proc, index in zip(procs, range(pods), strict=True):
                assert proc.poll() is None, (tmp_path / f"pod{index}.log").read_text()[-3000:]
            try:
                info = await target_nc.jetstream().stream_info("CMDB_COPY")
            except Exception:
                return False
            return bool(info.state.messages == MESSAGES)

        await wait_for(copied, within=30, interval=0.2)
        await wait_for(lambda: all(_ready(p) for p in ports), within=10, interval=0.2)
        if ordered:
            msg = await target_nc.jetstream().get_msg("CMDB_COPY", seq=MESSAGES)
            assert msg.data == f'{{"n": {MESSAGES - 1}}}'.encode()
        info = await source_js.consumer_info("CMDB", consumer)
        assert info.num_pending == 0
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 15) == 0


@pytest.mark.parametrize("mode", ["ordered", "standby", "scaled"])
async def test_the_operators_deployment_replicates(
    mode: str,
    api: Api,
    operator: Reconciler,
    tmp_path: Path,
    source_server: LocalNatsServer,
    target_server: LocalNatsServer,
    source_nc: Client,
    target_nc: Client,
) -> None:
    spec: dict[str, Any] = {"mode": "scaled" if mode == "scaled" else "ordered"}
    if mode == "scaled":
        spec.update(replicas=2, workersPerPod=3)
    if mode == "standby":
        spec.update(replicas=2)  # a leader and a hot standby: leader election in the config
    name = f"cmdb-{mode}"
    await api.create(_resource(name, source_server.url, target_server.url, **spec))
    consumer = f"e2e_{name}_grp" if mode == "scaled" else f"e2e_{name}"
    pods = 1 if mode == "ordered" else 2
    await _run_pods(api, name, pods, tmp_path, source_nc.jetstream(), target_nc, consumer, mode != "scaled")


async def test_tls_secret_mounted_from_its_object(
    api: Api, operator: Reconciler, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client
) -> None:
    """A source that demands client certificates: the worker gets them only through the Secret."""
    ca = certs.CertificateAuthority.create()
    server_files = certs.write_server(ca, tmp_path / "server", "nats")
    client = ca.issue("replicator", client=True)
    material = {
        "ca.crt": certs.cert_pem(ca.cert),
        "tls.crt": certs.cert_pem(client.cert),
        "tls.key": certs.key_pem(client.key),
    }
    with LocalNatsServer(name="tls-source", extra_config=certs.server_tls_block(server_files), scheme="tls") as source:
        await api.create(h.fake_secret("source-tls", NS, material))
        resource = _resource("cmdb-tls", source.url, target_server.url)
        resource["spec"]["source"]["tlsSecret"] = "source-tls"
        await api.create(resource)
        auth = connection.Auth(ca=material["ca.crt"], cert=material["tls.crt"], key=material["tls.key"])
        tls = auth.material().ssl_context
        source_nc = await nats.connect(source.url, tls=tls)
        try:
            await _run_pods(api, "cmdb-tls", 1, tmp_path, source_nc.jetstream(), target_nc, "e2e_cmdb-tls", True)
        finally:
            await source_nc.close()


async def test_credentials_secret_mounted_from_its_object(
    api: Api, operator: Reconciler, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client
) -> None:
    """A source in operator (JWT) mode: the worker authenticates with the .creds file from the Secret."""
    auth = nats_jwt.Decentralised.create()
    creds = auth.write_creds(tmp_path / "user.creds")
    with LocalNatsServer(name="creds-source", extra_config=auth.server_config()) as source:
        await api.create(h.fake_secret("source-creds", NS, {"replicator.creds": creds.read_bytes()}))
        resource = _resource("cmdb-creds", source.url, target_server.url)
        resource["spec"]["source"]["credentialsSecret"] = {"name": "source-creds", "key": "replicator.creds"}
        await api.create(resource)
        source_nc = await nats.connect(source.url, user_credentials=str(creds))
        try:
            await _run_pods(api, "cmdb-creds", 1, tmp_path, source_nc.jetstream(), target_nc, "e2e_cmdb-creds", True)
        finally:
            await source_nc.close()
