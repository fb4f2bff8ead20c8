"""The fleet-health job signs in with a user name file and a password file (`--user-file`,
`--password-file`, the data source's `user_file`/`password_file`): the arguments the operator's
ScheduledSparkApplication gives it, its Secret mount pointed at local copies, run on local[2]
against a server that requires that user and password. The password is in no argument and no
output; unusable files and flags end the run at start with exit status 2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from replication_operator.build.spark_application import BASIC_AUTH_DIR, build_scheduled_spark_application
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
USER, PASSWORD = "fleet-health", "fh-p@ss/w#rd:%-Zk4"  # no percent-encoding in a file


def _job_arguments(url: str, output: Path, mount: Path) -> list[str]:
    """The operator's arguments for a target with a basic-auth Secret, the mount moved to `mount`."""
    resource = fleet_resource({"url": url, "basicAuthSecret": {"name": "fleet-login"}}, STREAM, str(output))
    app = build_scheduled_spark_application(parse_spec(resource))
    for role in ("driver", "executor"):
        assert app["spec"]["template"][role]["secrets"] == [
            {"name": "fleet-login", "path": BASIC_AUTH_DIR, "secretType": "Generic"}]
    arguments = [a.replace(BASIC_AUTH_DIR, str(mount)) for a in app["spec"]["template"]["arguments"]]
    assert PASSWORD not in " ".join(arguments)
    return arguments


def test_the_job_reads_user_and_password_files(spark: SparkSession, tmp_path: Path) -> None:
    mount = tmp_path / "secret"
    mount.mkdir()
    (mount / "username").write_text(USER + "\n")
    (mount / "password").write_text(PASSWORD + "\n")
    auth = f'authorization {{ users = [ {{ user: "{USER}", password: "{PASSWORD}" }} ] }}'
    with LocalNatsServer(name="fleet-basic", store_dir=tmp_path / "js", extra_config=auth) as server:
        connection = NatsConnection.build(server.url, user_file=str(mount / "username"),
                                          password_file=str(mount / "password"))

        asyncio.run(fill_advisories(connection, STREAM))
        output = tmp_path / "out"
        status, out, err = run_cli([*_job_arguments(server.url, output, mount), "--now", str(NOW),
                                 "--master", "local[2]", "--kv-bucket", "FH_BASIC"])
        assert status == 0, err
        assert PASSWORD not in out + err
        summary = asyncio.run(read_summary(connection, "FH_BASIC"))
        assert summary is not None and summary["fleet"]["nodes"] == EXPECTED_FLEET["nodes"]
        # The data source takes the same files as options, on the driver and every executor.
        df = (spark.read.format("jetstream").option("url", server.url).option("stream", STREAM)
              .option("user_file", str(mount / "username")).option("password_file", str(mount / "password"))
              .option("partitions", "2").load())
        assert df.count() == len(MESSAGES)

        status, _, err = run_cli(["--url", server.url, "--stream", STREAM, "--output", str(tmp_path / "refused"),
                               "--user-file", str(mount / "username"), "--password-file", str(mount / "username")])
        assert status == 1 and "refused the credentials" in err and PASSWORD not in err, err
        assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--user-file", "{mount}/username"], "--user-file and --password-file go together"),
    (["--user-file", "{mount}/username", "--password-file", "{mount}/nope"],
     "--password-file: file {mount}/nope is not readable"),
    (["--user-file", "{mount}/username", "--password-file", "{mount}/username", "--credentials", "{mount}/username"],
     "--credentials and --user-file/--password-file exclude each other"),
    (["--user-file", "{mount}/username", "--password-file", "{mount}/username", "--url", "nats://u:pw@127.0.0.1:1"],
     "a user:password or token in the url and --user-file/--password-file exclude each other"),
    (["--credentials", "{mount}/username", "--url", "nats://u:pw@127.0.0.1:1"],
     "a user:password or token in the url and --credentials exclude each other"),
    (["--user-jwt", "{mount}/username", "--nkey-seed", "{mount}/username", "--url", "nats://tok@127.0.0.1:1"],
     "a user:password or token in the url and --user-jwt/--nkey-seed exclude each other"),
])
def test_unusable_arguments_exit_2(tmp_path: Path, extra: list[str], message: str) -> None:
    (tmp_path / "username").write_text(USER)
    arguments = ["--url", "nats://127.0.0.1:1", "--stream", STREAM, "--output", str(tmp_path / "out"),
                 *(a.format(mount=tmp_path) for a in extra)]
    status, _, err = run_cli(arguments)
    assert status == 2 and message.format(mount=tmp_path) in err, err
