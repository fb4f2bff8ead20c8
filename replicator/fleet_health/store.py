"""The job's Parquet output: tables for readers plus what the next run needs to resume.

Layout under the output root (a local path or any Hadoop URI, e.g. `s3a://bucket/fleet`)::

    events/run=<n>/        valid, de-duplicated advisories first seen by run n (the history)
    state/run=<n>/nodes/   node state after run n
    state/run=<n>/runs/    the log of every run up to n (sequence range, counts)
    state/run=<n>/_COMMITTED
    nodes/ sites/ fleet/   the latest tables, rewritten after each commit

A run becomes visible only when its `_COMMITTED` marker exists, so a run that dies half-way is simply
redone: its number is reused and its partial directories are overwritten or removed. Nothing is
renamed, which object stores cannot do atomically.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from replicator.fleet_health.advisories import EVENT_SCHEMA

COMMITTED = "_COMMITTED"
KEEP_SNAPSHOTS = 2
_RUN_DIR = re.compile(r"^run=(\d+)$")


@dataclass(frozen=True)
class RunRecord:
    """One line of the run log."""

    run: int
    run_time: int
    stream: str
    first_sequence: int | None
    last_sequence: int
    read: int
    events: int
    duplicates: int
    malformed: int


RUN_SCHEMA = StructType(
    [
        StructField("run", LongType(), False),
        StructField("run_time", LongType(), False),
        StructField("stream", StringType(), False),
        StructField("first_sequence", LongType(), True),
        StructField("last_sequence", LongType(), False),
        StructField("read", LongType(), False),
        StructField("events", LongType(), False),
        StructField("duplicates", LongType(), False),
        StructField("malformed", LongType(), False),
    ]
)


@dataclass(frozen=True)
class Snapshot:
    """The last committed run and the run log that leads to it."""

    run: int
    runs: tuple[RunRecord, ...]

    @property
    def last_sequence(self) -> int:
        return self.runs[-1].last_sequence

    def total(self, field: str) -> int:
        return sum(int(getattr(record, field)) for record in self.runs)


class OutputStore:
    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")

    def path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    # Hadoop FileSystem through the JVM: the same code serves local paths, HDFS and s3a.
    def _fs_path(self, path: str) -> tuple[Any, Any]:
        jvm = self.spark._jvm
        assert jvm is not None
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        return hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()), hadoop_path

    def exists(self, path: str) -> bool:
        fs, p = self._fs_path(path)
        return bool(fs.exists(p))

    def delete(self, path: str) -> None:
        fs, p = self._fs_path(path)
        fs.delete(p, True)

    def _runs_under(self, path: str) -> list[int]:
        fs, p = self._fs_path(path)
        if not fs.exists(p):
            return []
        found = (_RUN_DIR.match(status.getPath().getName()) for status in fs.listStatus(p))
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> Snapshot | None:
        committed = [n for n in self._runs_under(self.path("state")) if self._is_committed(n)]
        if not committed:
            return None
        run = committed[-1]
        rows = self.spark.read.schema(RUN_SCHEMA).parquet(self.path("state", f"run={run}", "runs")).collect()
        records = sorted((RunRecord(**row.asDict()) for row in rows), key=lambda r: r.run)
        return Snapshot(run=run, runs=tuple(records))

    def _is_committed(self, run: int) -> bool:
        return self.exists(self.path("state", f"run={run}", COMMITTED))

    def state(self, run: int) -> DataFrame:
        return self.spark.read.parquet(self.path("state", f"run={run}", "nodes"))

    def history(self, upto_run: int) -> DataFrame | None:
        """Events of committed runs only: a crashed run's partition may still be on disk."""
        if not self._runs_under(self.path("events")):
            return None
        schema = StructType([*EVENT_SCHEMA.fields, StructField("run", LongType(), False)])
        events = self.spark.read.schema(schema).parquet(self.path("events"))
        return events.where(F.col("run") <= F.lit(upto_run)).drop("run")

    def write_events(self, run: int, events: DataFrame) -> None:
        events.write.mode("overwrite").parquet(self.path("events", f"run={run}"))

    def write_blind_spots(self, run: int, spots: DataFrame) -> None:
        spots.coalesce(1).write.mode("overwrite").parquet(self.path("blind_spots", f"run={run}"))

    def blind_spots(self, upto_run: int) -> DataFrame | None:
        """Every blind spot advised up to `upto_run` (this run's included): `replicator`, `from`, `until`."""
        runs = [n for n in self._runs_under(self.path("blind_spots")) if n <= upto_run]
        if not runs:
            return None
        return self.spark.read.parquet(*(self.path("blind_spots", f"run={n}") for n in runs))

    def write_nodes(self, run: int, nodes: DataFrame) -> DataFrame:
        target = self.path("state", f"run={run}", "nodes")
        nodes.write.mode("overwrite").parquet(target)
        return self.spark.read.parquet(target)

    def commit(self, snapshot: Snapshot) -> None:
        rows = [tuple(asdict(r).values()) for r in snapshot.runs]
        base = self.path("state", f"run={snapshot.run}")
        self.spark.createDataFrame(rows, RUN_SCHEMA).coalesce(1).write.mode("overwrite").parquet(f"{base}/runs")
        fs, marker = self._fs_path(f"{base}/{COMMITTED}")
        fs.create(marker, True).close()

    def publish(self, run: int, sites: DataFrame, fleet: DataFrame) -> None:
        """Stable copies for readers; a crash here is repaired by the next run."""
        self.state(run).coalesce(max(1, self.spark.sparkContext.defaultParallelism)).write.mode("overwrite").parquet(
            self.path("nodes")
        )
        sites.coalesce(1).write.mode("overwrite").parquet(self.path("sites"))
        fleet.coalesce(1).write.mode("overwrite").parquet(self.path("fleet"))

    def prune(self, run: int) -> None:
        """Drop snapshots older than the previous one, and leftovers of runs that never committed."""
        for n in self._runs_under(self.path("state")):
            if n > run or n <= run - KEEP_SNAPSHOTS:
                self.delete(self.path("state", f"run={n}"))
        for folder in ("events", "blind_spots"):
            for n in self._runs_under(self.path(folder)):
                if n > run:
                    self.delete(self.path(folder, f"run={n}"))
