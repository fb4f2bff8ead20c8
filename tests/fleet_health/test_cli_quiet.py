"""The fleet-health command line prints its tables, not Spark's start-up noise, unless `--verbose`.
Each case starts its own JVM (the noise comes with a JVM's start), so they run as child processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from tests.fleet_health.helpers import MESSAGES, NOW, publish

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NOISE = ("WARNING: Using incubator modules", "Using Spark's default log4j profile", "Setting default log level",
         "WARN NativeCodeLoader")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
async def test_spark_start_up_noise_only_with_verbose(verbose: bool, source_server: LocalNatsServer,
                                                      source_nc: Client, tmp_path: Path) -> None:
    await source_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisory.>"])
    await publish(source_nc, MESSAGES)
    args = ["fleet-health", "--url", source_server.url, "--stream", "ADV", "--output", str(tmp_path / "out"),
            "--now", str(NOW), *(["--verbose"] if verbose else [])]
    done = subprocess.run([sys.executable, "-m", "replicator", *args], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].split() == ["fleet", "(3", "sites)", "8", "5", "2", "1", "0", "71.43%"]
    printed = [noise for noise in NOISE if noise in done.stdout + done.stderr]
    if verbose:  # the banner always; the JVM's own warnings depend on the JDK
        assert {"Using Spark's default log4j profile", "Setting default log level"} <= set(printed), done.stderr
        assert "INFO replicator.fleet_health.job: fleet health run 1" in done.stderr
    else:
        assert printed == [] and done.stderr == "", done.stderr
