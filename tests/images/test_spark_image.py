"""The `spark` image, started the way Spark on Kubernetes starts its pods: the driver runs the
fleet-health job over a real advisory stream and writes its tables; an executor's JVM starts with
the arguments and options the executor pod gives it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from nats.aio.client import Client
from replication_operator.build.spark_application import MAIN_APPLICATION_FILE, build_scheduled_spark_application
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.fleet_health.helpers import (
    EXPECTED_FLEET,
    EXPECTED_NODES,
    EXPECTED_SITES,
    MESSAGES,
    NODE_FIELDS,
    NOW,
    SUBJECT,
    publish,
)
from tests.images.support import Podman, RunOptions, writable_by
from tests.support.kube_emulator import wait_for

STREAM = "ADVISORIES"
CONF_DIR = "/opt/spark/conf"  # where Spark on Kubernetes mounts spark.properties
OUTPUT = "/data/fleet-health"


def _application(url: str) -> dict[str, Any]:
    """The ScheduledSparkApplication template the operator builds for a resource with fleetHealth."""
    resource = {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": "cmdb", "namespace": "images"},
        "spec": {
            "topic": "acme.cmdb.>",
            "source": {"url": url},
            "target": {"url": url},
            "advisory": {"subject": SUBJECT, "cluster": "target"},
            "fleetHealth": {"output": OUTPUT, "stream": STREAM},
        },
    }
    return dict(build_scheduled_spark_application(parse_spec(resource))["spec"]["template"])


def _pod_options(pod: dict[str, Any]) -> RunOptions:
    """The driver's or executor's security settings as the application states them, and a read-only
    root filesystem besides (stricter than the application asks: the image needs no writes there)."""
    pod_security, container_security = pod["podSecurityContext"], pod["securityContext"]
    return RunOptions(
        user=f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}",
        read_only=True,
        cap_drop_all=container_security["capabilities"]["drop"] == ["ALL"],
        no_new_privileges=container_security["allowPrivilegeEscalation"] is False,
        # Spark's own emptyDir for spark.local.dir, and /tmp.
        tmpfs=["/tmp", "/var/data/spark-local"],
    )


async def test_driver_runs_the_fleet_health_job(
    podman: Podman, spark_image: str, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client
) -> None:
    """`driver --properties-file ... --class org.apache.spark.deploy.PythonRunner local:///app/...`
    with the operator's arguments; the properties file points at a local[2] master instead of the
    cluster, so the driver runs the whole job itself."""
    js = target_nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["sr.advisory.>"])
    await publish(target_nc, MESSAGES)

    app = _application(target_server.url)
    assert app["image"] == "ghcr.io/stream-replicator/stream-replicator:0.1.0-spark"
    assert app["mainApplicationFile"] == MAIN_APPLICATION_FILE
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark.properties").write_text(
        "\n".join(
            [
                "spark.master=local[2]",
                "spark.app.name=cmdb-fleet-health",
                f"spark.driver.memory={app['driver']['memory']}",
                "spark.driver.host=127.0.0.1",
                "spark.ui.enabled=false",
                "spark.sql.shuffle.partitions=2",
                "",
            ]
        )
    )
    output = writable_by(tmp_path / "data")
    options = _pod_options(app["driver"])
    options.mounts += [(conf, CONF_DIR, True), (output, "/data", False)]
    options.env = {
        "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",
        "SPARK_CONF_DIR": CONF_DIR,
        "SPARK_LOCAL_DIRS": "/var/data/spark-local",
        "SPARK_USER": "replicator",
        "SPARK_APPLICATION_ID": "spark-images-test",
    }
    args = [
        "driver",
        "--properties-file",
        f"{CONF_DIR}/spark.properties",
        "--class",
        "org.apache.spark.deploy.PythonRunner",
        app["mainApplicationFile"],
        *app["arguments"],
        "--now",  # the expected tables are computed for this clock
        str(NOW),
    ]
    code, log = await asyncio.to_thread(podman.run, spark_image, args, options, tmp_path / "driver.log", 240)
    assert code == 0, log[-6000:]

    tables = output / OUTPUT.removeprefix("/data/")
    nodes = pq.read_table(tables / "nodes").to_pylist()
    assert sorted(tuple(row[f] for f in NODE_FIELDS) for row in nodes) == sorted(EXPECTED_NODES)
    sites = sorted(pq.read_table(tables / "sites").to_pylist(), key=lambda r: r["replicator"])
    fields = ("replicator", "nodes", "healthy", "timeout", "expired", "availability")
    assert [tuple(r[f] for f in fields) for r in sites] == EXPECTED_SITES
    (fleet,) = pq.read_table(tables / "fleet").to_pylist()
    assert {k: fleet[k] for k in EXPECTED_FLEET} == pytest.approx(EXPECTED_FLEET)
    kv = await js.key_value(app["arguments"][app["arguments"].index("--kv-bucket") + 1])
    assert await kv.keys()


@contextlib.contextmanager
def _fake_driver() -> Iterator[tuple[int, threading.Event]]:
    """A loopback listener where an executor connects to its driver; it holds the connection open
    and answers nothing, so the executor waits (alive) until the test stops it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    connected, stop = threading.Event(), threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            connected.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], connected
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


async def test_executor_branch_starts_the_executor_backend(podman: Podman, spark_image: str, tmp_path: Path) -> None:
    """`executor` with the variables Spark puts in an executor pod: the JVM runs
    KubernetesExecutorBackend with the pod's options in order and connects to the driver URL."""
    app = _application(f"nats://127.0.0.1:{free_port()}")
    executor = app["executor"]
    options = _pod_options(executor)
    with _fake_driver() as (port, connected):
        options.env = {
            "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
            "SPARK_EXECUTOR_ID": "1",
            "SPARK_EXECUTOR_CORES": str(executor["cores"]),
            "SPARK_EXECUTOR_MEMORY": executor["memory"],
            "SPARK_APPLICATION_ID": "spark-images-test",
            "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
            "SPARK_EXECUTOR_POD_NAME": "cmdb-fleet-health-exec-1",
            "SPARK_RESOURCE_PROFILE_ID": "0",
            "SPARK_CONF_DIR": CONF_DIR,
            "SPARK_LOCAL_DIRS": "/var/data/spark-local",
            "SPARK_USER": "replicator",
            # Spark numbers the executor's JVM options; 10 sorts after 2 numerically, not as text.
            "SPARK_JAVA_OPT_0": "-Dspark.sr.order=zero",
            "SPARK_JAVA_OPT_10": "-Dspark.sr.order=ten",
            "SPARK_JAVA_OPT_2": "-Dspark.sr.order=two",
        }
        with podman.start(spark_image, ["executor"], options, tmp_path / "executor.log") as container:
            await wait_for(lambda: connected.is_set() or not container.running(), within=120, interval=0.2)
            assert connected.is_set(), container.output()[-4000:]
            processes = container.exec("ps", "-eo", "pid=,args=").stdout.splitlines()
    by_pid = dict(line.split(None, 1) for line in processes)
    # tini is the first process (it reaps and forwards signals) and runs the JVM.
    assert by_pid["1"].startswith("/usr/bin/tini -s -- /opt/java/bin/java "), processes
    (java,) = [args for args in by_pid.values() if args.startswith("/opt/java/bin/java ")]
    assert java.index("order=zero") < java.index("order=two") < java.index("order=ten")
    memory = executor["memory"]
    expected = (
        f"-Xms{memory} -Xmx{memory} -cp {CONF_DIR}:/opt/venv/lib/python3.11/site-packages/pyspark/jars/* "
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend "
        f"--driver-url spark://CoarseGrainedScheduler@127.0.0.1:{port} --executor-id 1 "
        f"--cores {executor['cores']} --app-id spark-images-test --hostname 127.0.0.1 --resourceProfileId 0 "
        "--podName cmdb-fleet-health-exec-1"
    )
    assert java.endswith(expected), java


async def test_default_command_passes_through(podman: Podman, spark_image: str, tmp_path: Path) -> None:
    code, log = await asyncio.to_thread(podman.run, spark_image, [], RunOptions(), tmp_path / "help.log", 60)
    assert code == 0 and "usage: stream-replicator fleet-health" in log, log
