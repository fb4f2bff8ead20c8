"""The SparkSession the job runs in, with the JetStream data source registered."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from replicator.fleet_health.source import JetStreamDataSource
from replicator.fleet_health.spark_logs import launch_quietly

APP_NAME = "stream-replicator-fleet-health"

# Small-machine settings for local masters only; on a cluster the SparkApplication decides.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
    # A local run talks to itself only: bind and advertise loopback, never the host's interfaces.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def spark_session(master: str | None = None, conf: dict[str, str] | None = None, *,
                  quiet: bool = False) -> SparkSession:
    """`master=None` leaves the master to spark-submit (the Spark operator's case); `quiet`: the
    driver JVM's start-up noise is not printed (see `spark_logs`)."""
    builder = SparkSession.builder.appName(APP_NAME).config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            # Python workers must run this interpreter (the one with nats-py and pyarrow), not
            # whatever `python3` is first on PATH; the variable has to be set before the JVM starts.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            for key, value in LOCAL_CONF.items():
                builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if quiet:
        launch_quietly(builder)
    session = builder.getOrCreate()
    if master is not None and master.startswith("local"):
        session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(JetStreamDataSource)
    return session
