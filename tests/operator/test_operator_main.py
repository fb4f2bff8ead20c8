"""`stream-replicator-operator`: flags, and the console script run as a process against the API emulator."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from replication_operator import main as cli
from replication_operator.kube import KubeApi
from replication_operator.model import naming

from replicator.demo.local_nats import free_port
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.support import certs
from tests.support.kube_emulator import ApiCall, ClusterEmulator, wait_for

SCRIPT = str(Path(sys.prefix) / "bin" / "stream-replicator-operator")


def test_help() -> None:
    result = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--namespace", "--all-namespaces", "--peering", "--standalone", "--liveness", "--verbose",
                 "--roles-only", *cli.POLICY_FLAGS):
        assert flag in result.stdout


def test_scope_is_required_and_exclusive() -> None:
    for argv in ([], ["-n", "a", "--all-namespaces"]):
        with pytest.raises(SystemExit) as err:
            cli.build_parser().parse_args(argv)
        assert err.value.code == 2


def test_flags() -> None:
    args = cli.build_parser().parse_args(["-n", "team-a", "--namespace", "team-b"])
    assert args.namespaces == ["team-a", "team-b"]
    assert (args.peering, args.standalone, args.liveness) == (
        "stream-replicator",
        False,
        cli.DEFAULT_LIVENESS,
    )
    args = cli.build_parser().parse_args(["--all-namespaces", "--standalone", "--verbose", "--liveness", ""])
    assert args.all_namespaces and args.standalone and args.verbose and args.liveness == ""


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "emulator",
                "clusters": [{"name": "emulator", "cluster": {"server": server}}],
                "users": [{"name": "operator", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "operator"}}],
            }
        )
    )
    return path


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _liveness(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
            return dict(json.loads(resp.read() or b"{}"))
    except OSError:
        return None


def _metrics(port: int, needle: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return text if needle in text else None


async def test_console_script_serves_the_cluster_with_peering(tmp_path: Path) -> None:
    """Two operator processes share a peering object: the higher priority acts, the other waits."""
    async with ClusterEmulator() as cluster:
        from kmock import Server

        async with Server(cluster):
            api = Api(cluster)
            await api._send(
                "POST",
                "/apis/kopf.dev/v1/clusterkopfpeerings",
                {
                    "apiVersion": "kopf.dev/v1",
                    "kind": "ClusterKopfPeering",
                    "metadata": {"name": "stream-replicator"},
                },
            )
            env = dict(
                os.environ,
                KUBECONFIG=str(_kubeconfig(tmp_path / "kubeconfig", str(cluster.url))),
                STREAM_REPLICATOR_WORKER_IMAGE="registry.example/sr:1.2.3",
            )
            port, metrics_port = free_port(), free_port()
            procs = []
            logs = []
            for priority, liveness, metrics in ((100, f"http://127.0.0.1:{port}/healthz", metrics_port), (50, "", 0)):
                log = tmp_path / f"operator-{priority}.log"
                logs.append(log)
                argv = [SCRIPT, "--all-namespaces", "--priority", str(priority), "--liveness", liveness,
                        "--metrics-port", str(metrics)]
                procs.append(_start(argv, env, log))
            try:
                await wait_for(lambda: _liveness(port) is not None, within=20, interval=0.1)
                await wait_for(
                    lambda: "Initial authentication has finished" in logs[1].read_text(),
                    within=20,
                    interval=0.1,
                )
                # The lower-priority process starts paused, or resumes for an instant before it sees
                # the other's peering record; either way it ends up waiting.
                await asyncio.sleep(1.5)
                waiting = logs[1].read_text()
                if "Resuming operations" in waiting:
                    assert "Pausing operations in favour of" in waiting.split("Resuming operations")[-1]
                mark = len(waiting)
                resource = h.example("telemetry-region", "prod")
                for key in ("uid", "generation"):
                    resource["metadata"].pop(key)
                resource["spec"].pop("image")
                await api.create(resource)
                deployment = await wait_for(
                    lambda: api.get(naming.DEPLOYMENT, "prod", "telemetry-region"), within=20, interval=0.1
                )
                image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
                assert image == "registry.example/sr:1.2.3"
                assert "resources" in (_liveness(port) or {})  # our probe (kopf caches its value)
                metrics = await wait_for(lambda: _metrics(metrics_port, "telemetry-region"), within=10, interval=0.1)
                assert 'stream_replicator_resource_replicas_desired{namespace="prod",' in metrics
                await wait_for(lambda: "Handler 'apply-create' succeeded" in logs[0].read_text(), within=5)
                # The operator's own client (the official one) logged in from the same kubeconfig.
                await wait_for(lambda: ApiCall("patch", naming.GROUP, "streamreplications/status", True)
                               in cluster.calls_of("not-a-secret"), within=5)
                assert ApiCall("create", "apps", "deployments", True) in cluster.calls_of("not-a-secret")
                await asyncio.sleep(0.5)
                waiting = logs[1].read_text()[mark:]
                assert "Handler 'apply-" not in waiting and "Resuming operations" not in waiting
            finally:
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
                codes = [await asyncio.to_thread(proc.wait, 20) for proc in procs]
            assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]


async def test_the_client_takes_kopfs_connection_info(tmp_path: Path) -> None:
    """Certificate material given as data (a kubeconfig with embedded certificates) reaches the
    official client as private files; a token as its bearer key."""
    ca = certs.CertificateAuthority.create()
    client = ca.issue("operator", client=True)
    cert, key = certs.cert_pem(client.cert), certs.key_pem(client.key)
    api = KubeApi()
    api.use(kopf.ConnectionInfo(server="https://10.0.0.1:6443/", ca_data=certs.cert_pem(ca.cert),
                                certificate_data=cert, private_key_data=key, token="t0k3n"))
    try:
        assert api._client is not None
        config = api._client.configuration
        assert config.host == "https://10.0.0.1:6443" and config.verify_ssl
        assert config.ca_cert_data == certs.cert_pem(ca.cert).decode()
        assert _read(config.cert_file) == cert and _read(config.key_file) == key
        assert oct(os.stat(config.key_file).st_mode & 0o777) == "0o600"
        assert await config.get_api_key_with_prefix("BearerToken") == "Bearer t0k3n"
    finally:
        await api.close()
    assert not _exists(config.key_file)


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _exists(path: str) -> bool:
    return os.path.exists(path)
