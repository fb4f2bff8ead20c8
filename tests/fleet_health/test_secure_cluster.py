"""The job against a broker as Choria runs them (TLS with client certificates, JWT accounts), on
local[2] and on a real standalone cluster through spark-submit, with the arguments the operator's
ScheduledSparkApplication gives it; and what happens when the TLS material is wrong."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from replication_operator.build.spark_application import CREDENTIALS_DIR, TLS_DIR, build_scheduled_spark_application
from replication_operator.model.spec import parse_spec

from replicator.demo.local_nats import LocalNatsServer
from replicator.fleet_health.cli import add_arguments, run_from_args
from replicator.fleet_health.connection import NatsConnection, connect
from replicator.fleet_health.standalone import StandaloneSpark, submit
from replicator.fleet_health.transforms import NODE_COLUMNS
from tests.fleet_health.helpers import (
    EXPECTED_FLEET,
    EXPECTED_NODES,
    EXPECTED_SITES,
    MESSAGES,
    NOW,
    fill_advisories,
    node_tuples,
    publish,
    read_summary,
    site_tuples,
)
from tests.support.certs import CertificateAuthority, key_pem, write_client, write_puppet, write_server
from tests.support.certs import server_tls_block as tls_block
from tests.support.nats_jwt import Decentralised

pytestmark = pytest.mark.spark

STREAM = "ADVISORIES"
IDENTITY = "fleet-health.example.net"
SCENARIOS = ("kubernetes-tls-creds", "puppet-tls-jwt-seed")


@dataclass
class Broker:
    """A server that requires client certificates and JWT users, and the reader's files in two layouts."""

    server: LocalNatsServer
    root: Path
    auth: Decentralised
    ca: CertificateAuthority
    secrets: list[str]  # text that must never show up in any log
    results: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url.replace("nats://", "tls://")

    def arguments(self, scenario: str, output: Path, bucket: str) -> list[str]:
        if scenario == "kubernetes-tls-creds":
            return [*kubernetes_arguments(self, output, bucket), "--now", str(NOW)]
        return ["--url", self.url, "--stream", STREAM, "--output", str(output), "--kv-bucket", bucket,
                "--partitions", "2", "--tls-ssl-dir", str(self.root / "ssl"), "--tls-identity", IDENTITY,
                "--user-jwt", str(self.root / "user.jwt"), "--nkey-seed", str(self.root / "user.nk"),
                "--now", str(NOW)]

    def connection(self) -> NatsConnection:
        k8s = self.root / "k8s"
        return NatsConnection.build(self.url, credentials=str(k8s / "nats" / "user.creds"),
                                    tls_ca=str(k8s / "tls" / "ca.crt"), tls_cert=str(k8s / "tls" / "tls.crt"),
                                    tls_key=str(k8s / "tls" / "tls.key"))


def kubernetes_arguments(broker: Broker, output: Path, bucket: str) -> list[str]:
    """The job's arguments from the operator's object, its Secret mounts pointed at local copies."""
    resource = {
        "metadata": {"name": "fleet", "namespace": "replication"},
        "spec": {
            "topic": "acme.cmdb",
            "source": {"url": "nats://source.example.net:4222"},
            "target": {"url": broker.url, "tlsSecret": "fleet-tls", "credentialsSecret": {"name": "fleet-nats"}},
            "advisory": {"subject": "sr.advisory.cmdb"},
            "fleetHealth": {"stream": STREAM, "output": str(output), "kvBucket": bucket,
                            "executor": {"instances": 1, "cores": 2}},
        },
    }
    app = build_scheduled_spark_application(parse_spec(resource))
    k8s = broker.root / "k8s"
    mounts = {CREDENTIALS_DIR: str(k8s / "nats"), TLS_DIR: str(k8s / "tls")}
    for role in ("driver", "executor"):  # what the Spark operator mounts where
        assert {s["path"] for s in app["spec"]["template"][role]["secrets"]} == set(mounts)
    out = []
    for argument in app["spec"]["template"]["arguments"]:
        for mount, local in mounts.items():
            argument = argument.replace(mount, local) if argument.startswith(mount + "/") else argument
        out.append(argument)
    return out


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("broker")
    ca, auth = CertificateAuthority.create(), Decentralised.create()
    server_files = write_server(ca, root / "server", "nats")
    # Kubernetes Secrets as mounted: a TLS Secret (ca.crt, tls.crt, tls.key) and a .creds Secret.
    k8s = write_client(ca, root / "client", "fleet-health")
    (root / "k8s" / "tls").mkdir(parents=True)
    for src, name in ((k8s.ca, "ca.crt"), (k8s.cert, "tls.crt"), (k8s.key, "tls.key")):
        (root / "k8s" / "tls" / name).write_bytes(src.read_bytes())
    (root / "k8s" / "nats").mkdir()
    auth.write_creds(root / "k8s" / "nats" / "user.creds")
    # A Puppet node: ssl dir by identity, with a user JWT and its nkey seed in two files.
    write_puppet(ca, root / "ssl", IDENTITY)
    (root / "user.jwt").write_text(auth.user_jwt())
    (root / "user.nk").write_text(auth.user.seed.decode())
    key_lines = [line for p in (root / "k8s" / "tls" / "tls.key", root / "ssl" / "private_keys" / f"{IDENTITY}.pem")
                 for line in p.read_text().splitlines() if "-----" not in line and len(line) > 20]
    secrets = [auth.user.seed.decode(), auth.user_jwt().split(".")[2], *key_lines]

    server = LocalNatsServer(name="fleet-tls-jwt", store_dir=root / "js",
                             extra_config=tls_block(server_files) + auth.server_config()).start()
    try:
        broker = Broker(server, root, auth, ca, secrets)
        asyncio.run(fill_advisories(broker.connection()))
        yield broker
    finally:
        server.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def _cli(arguments: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = run_from_args(_parser().parse_args(arguments))
    return status, out.getvalue(), err.getvalue()


def _tables(spark: SparkSession, output: Path, broker: Broker, bucket: str) -> dict[str, Any]:
    nodes = spark.read.parquet(str(output / "nodes")).select(*NODE_COLUMNS).collect()
    sites = spark.read.parquet(str(output / "sites")).orderBy("replicator").collect()
    fleet = spark.read.parquet(str(output / "fleet")).first()
    assert fleet is not None
    return {
        "nodes": sorted(tuple(r) for r in nodes),
        "node_tuples": node_tuples(nodes),
        "sites": site_tuples([s.asDict() for s in sites]),
        "fleet": fleet.asDict(),
        "summary": asyncio.run(read_summary(broker.connection(), bucket)),
    }


def local_run(spark: SparkSession, broker: Broker, scenario: str) -> dict[str, Any]:
    """The scenario on local[2] (once per module): the reference the cluster run must equal."""
    if (scenario, "local") not in broker.results:
        output, bucket = broker.root / f"out-local-{scenario}", f"FH_LOCAL_{SCENARIOS.index(scenario)}"
        status, _, err = _cli([*broker.arguments(scenario, output, bucket), "--master", "local[2]"])
        assert status == 0, err
        broker.results[(scenario, "local")] = _tables(spark, output, broker, bucket)
    return broker.results[(scenario, "local")]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_job_over_tls_and_jwt_on_local(spark: SparkSession, broker: Broker, scenario: str) -> None:
    result = local_run(spark, broker, scenario)
    assert result["node_tuples"] == sorted(EXPECTED_NODES)
    assert result["sites"] == EXPECTED_SITES
    assert result["fleet"] == pytest.approx(EXPECTED_FLEET)
    assert result["summary"]["last_sequence"] == len(MESSAGES)


@pytest.mark.slow
@pytest.mark.timeout(900)  # two spark-submits with their own JVMs: minutes on 2 shared cores
def test_the_job_on_a_standalone_cluster_equals_local(
    spark: SparkSession, spark_cluster: StandaloneSpark, broker: Broker
) -> None:
    """spark-submit of app.py to spark://127.0.0.1: executors in their own JVM and Python processes
    read the partitions over TLS as JWT users; the tables and summary equal local[2]'s, and no log
    or event log holds a key, seed or JWT signature."""
    events = broker.root / "events"
    events.mkdir(exist_ok=True)
    outputs = []
    for i, scenario in enumerate(SCENARIOS):
        output, bucket = broker.root / f"out-cluster-{scenario}", f"FH_CLUSTER_{i}"
        done = submit(spark_cluster.url, broker.arguments(scenario, output, bucket),
                      {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
                       "spark.eventLog.compress": "false"})  # plain text, to search
        assert done.returncode == 0, done.stderr[-4000:]
        outputs += [done.stdout, done.stderr]
        cluster = _tables(spark, output, broker, bucket)
        local = local_run(spark, broker, scenario)
        assert {k: v for k, v in cluster.items() if k != "summary"} == {
            k: v for k, v in local.items() if k != "summary"}
        assert {k: v for k, v in cluster["summary"].items() if k != "run"} == {
            k: v for k, v in local["summary"].items() if k != "run"}

    apps = spark_cluster.status()["completedapps"]
    assert len(apps) >= 2 and all(a["cores"] == 2 for a in apps)  # type: ignore[index,union-attr]
    executor_logs = [p for p in spark_cluster.logs() if p.name == "stderr"]
    assert len(executor_logs) >= 2  # one executor per application, in its own JVM
    assert any(re.search(r"Finished task .* in stage", p.read_text()) for p in executor_logs)

    logs = [p.read_text(errors="replace") for p in spark_cluster.logs()]
    event_logs = [p.read_text(errors="replace") for p in events.rglob("*") if p.is_file()]
    # The event log records the command line (Spark blanks all of it when it holds a word such as
    # "credentials"): file paths are there, never what the files hold.
    assert len(event_logs) >= 2 and any(str(broker.root / "user.nk") in e for e in event_logs)
    for secret in broker.secrets:
        for text in (*outputs, *logs, *event_logs):
            assert secret not in text


@pytest.mark.parametrize(
    ("problem", "status", "message"),
    [
        ("wrong CA", 1, r"TLS: cannot verify the server's certificate"),
        ("missing key", 2, r"--tls-key: file .*/missing\.pem is not readable"),
        ("key of another certificate", 1, r"tls-other\.key: does not match the certificate"),
    ],
)
def test_bad_tls_material_fails_clearly_and_writes_nothing(
    broker: Broker, tmp_path: Path, problem: str, status: int, message: str
) -> None:
    tls = broker.root / "k8s" / "tls"
    ca, cert, key = tls / "ca.crt", tls / "tls.crt", tls / "tls.key"
    if problem == "wrong CA":
        ca = CertificateAuthority.create("rogue").write_ca(tmp_path / "rogue.pem")
    elif problem == "missing key":
        key = tmp_path / "missing.pem"
    else:
        key = tmp_path / "tls-other.key"
        key.write_bytes(key_pem(broker.ca.issue("other", client=True).key))
    output = tmp_path / "out"
    code, _, err = _cli(["--url", broker.url, "--stream", STREAM, "--output", str(output),
                         "--credentials", str(broker.root / "k8s" / "nats" / "user.creds"),
                         "--tls-ca", str(ca), "--tls-cert", str(cert), "--tls-key", str(key)])
    assert code == status and re.search(message, err), err
    assert not output.exists()
    assert all(secret not in err for secret in broker.secrets)


@pytest.mark.parametrize(
    ("auth", "userinfo"),
    [
        ('authorization { user: fh, password: "p@ss/w#rd" }', "fh:p%40ss%2Fw%23rd@"),
        ('authorization { token: "s3cr3t-t0ken" }', "s3cr3t-t0ken@"),
    ],
    ids=["user-password", "token"],
)
def test_user_password_and_token_in_the_url(spark: SparkSession, tmp_path: Path, auth: str, userinfo: str) -> None:
    with LocalNatsServer(name="fleet-auth", store_dir=tmp_path / "js", extra_config=auth) as server:
        url = server.url.replace("nats://", f"nats://{userinfo}")

        async def fill() -> None:
            nc = await connect(url, name="fill")
            try:
                await nc.jetstream().add_stream(name=STREAM, subjects=["sr.advisory.>"])
                await publish(nc, MESSAGES[:5])
            finally:
                await nc.close()

        asyncio.run(fill())
        df = spark.read.format("jetstream").option("url", url).option("stream", STREAM) \
            .option("partitions", "2").load()
        assert sorted(r.sequence for r in df.collect()) == [1, 2, 3, 4, 5]
