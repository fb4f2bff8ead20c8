"""One local[2] SparkSession for all fleet-health tests (starting Spark costs seconds), and a standalone cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from replicator.fleet_health.session import spark_session
from replicator.fleet_health.standalone import StandaloneSpark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", {"spark.driver.memory": "768m", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneSpark]:
    """A standalone master and one 2-core worker on loopback, stopped (process groups and all) at the end."""
    with StandaloneSpark(cores=2, directory=tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster
