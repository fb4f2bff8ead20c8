"""One local[2] SparkSession for all fleet-health tests: starting Spark costs seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from replicator.fleet_health.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", {"spark.driver.memory": "768m", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
