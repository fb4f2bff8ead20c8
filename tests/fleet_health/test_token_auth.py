"""The fleet-health job signs in with a token file (`--token-file`, the data source's `token_file`): the
arguments the operator's ScheduledSparkApplication gives it for an advisory cluster whose NatsConnection
names a tokenSecret, its Secret mount pointed at a local copy, run on local[2] against a server that
requires that token. The token is in no argument, URL or output; bad flags exit 2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from replication_operator.build.spark_application import TOKEN_DIR, build_scheduled_spark_application
from replication_operator.model.connection import NatsConnectionSpec, resolved
from replication_operator.model.spec import parse_spec

from replicator.demo.local_nats import LocalNatsServer
from replicator.fleet_health.connection import NatsConnection
from tests.fleet_health.helpers import (
    EXPECTED_FLEET,
    MESSAGES,
    NOW,
    fill_advisories,
    fleet_resource,
    read_summary,
    run_cli,
)

pytestmark = pytest.mark.spark

STREAM = "ADVISORIES"
TOKEN = "fh-token-Qz7-never-shown"


def _job_arguments(url: str, output: Path, mount: Path) -> list[str]:
    """The operator's arguments for a target named by a NatsConnection with a tokenSecret, the mount
    moved to `mount`."""
    resource = fleet_resource({"connectionRef": {"name": "central"}}, STREAM, str(output))
    central = NatsConnectionSpec.model_validate({"url": url, "tokenSecret": {"name": "fleet-token"}})
    app = build_scheduled_spark_application(resolved(parse_spec(resource), {"central": central}))
    for role in ("driver", "executor"):
        assert app["spec"]["template"][role]["secrets"] == [
            {"name": "fleet-token", "path": TOKEN_DIR, "secretType": "Generic"}]
    arguments = [a.replace(TOKEN_DIR, str(mount)) for a in app["spec"]["template"]["arguments"]]
    assert arguments[arguments.index("--url") + 1] == url
    return arguments


def test_the_job_reads_a_token_file(spark: SparkSession, tmp_path: Path) -> None:
    mount = tmp_path / "secret"
    mount.mkdir()
    (mount / "token").write_text(TOKEN + "\n")
    with LocalNatsServer(name="fleet-token", store_dir=tmp_path / "js",
                         extra_config=f'authorization {{ token: "{TOKEN}" }}') as server:
        connection = NatsConnection.build(server.url, token_file=str(mount / "token"))
        asyncio.run(fill_advisories(connection, STREAM))
        output = tmp_path / "out"
        arguments = _job_arguments(server.url, output, mount)
        assert TOKEN not in " ".join(arguments)
        status, out, err = run_cli([*arguments, "--now", str(NOW), "--master", "local[2]", "--kv-bucket", "FH_TOKEN"])
        assert status == 0, err
        assert TOKEN not in out + err
        summary = asyncio.run(read_summary(connection, "FH_TOKEN"))
        assert summary is not None and summary["fleet"]["nodes"] == EXPECTED_FLEET["nodes"]
        # The data source takes the same file as an option, on the driver and every executor.
        df = (spark.read.format("jetstream").option("url", server.url).option("stream", STREAM)
              .option("token_file", str(mount / "token")).option("partitions", "2").load())
        assert df.count() == len(MESSAGES)

        (tmp_path / "wrong").write_text("not-the-token")
        status, _, err = run_cli(["--url", server.url, "--stream", STREAM, "--output", str(tmp_path / "refused"),
                               "--token-file", str(tmp_path / "wrong")])
        assert status == 1 and "not-the-token" not in err and TOKEN not in err, err
        assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--token-file", "{mount}/nope"], "--token-file: file {mount}/nope is not readable"),
    (["--token-file", "{mount}/token", "--credentials", "{mount}/token"],
     "--credentials and --token-file exclude each other"),
    (["--token-file", "{mount}/token", "--url", "nats://tok@127.0.0.1:1"],
     "a user:password or token in the url and --token-file exclude each other"),
])
def test_unusable_token_arguments_exit_2(tmp_path: Path, extra: list[str], message: str) -> None:
    (tmp_path / "token").write_text(TOKEN)
    arguments = ["--url", "nats://127.0.0.1:1", "--stream", STREAM, "--output", str(tmp_path / "out"),
                 *(a.format(mount=tmp_path) for a in extra)]
    status, _, err = run_cli(arguments)
    assert status == 2 and message.format(mount=tmp_path) in err, err
    assert TOKEN not in err
