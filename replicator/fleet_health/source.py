"""`spark.read.format("jetstream")`: a JetStream stream as a DataFrame, read in parallel by sequence range.

Planning asks the server for the stream's bounds once; each partition then reads its own slice on an
executor with its own connection and ephemeral consumer, so the read scales with executors and a
failed task is simply retried. Rows go to Spark as Arrow batches built column-wise: per-row tuples
would be type-checked one by one by PySpark's worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from replicator.fleet_health.connection import NatsConnection, connect
from replicator.fleet_health.jetstream import Columns, RangeReader, split_range, stream_bounds

SOURCE_NAME = "jetstream"
SCHEMA = StructType(
    [
        StructField("sequence", LongType(), nullable=False),
        StructField("subject", StringType(), nullable=False),
        StructField("time", TimestampType(), nullable=False),
        StructField("headers", MapType(StringType(), StringType()), nullable=True),
        StructField("data", BinaryType(), nullable=False),
    ]
)


@dataclass(frozen=True)
class ReadOptions:
    """Reader options (all strings in Spark): see docs/fleet-health.md. The connection holds URLs and
    file paths only; each executor reads the files itself."""

    connection: NatsConnection
    stream: str
    start_seq: int = 1
    end_seq: int | None = None
    partitions: int = 1
    subject: str | None = None
    batch: int = 1000
    chunk_rows: int = 10_000
    idle_timeout: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        missing = [k for k in ("url", "stream") if not lowered.get(k)]
        if missing:
            raise ValueError(f"jetstream source: option(s) {', '.join(missing)} required")

        def number(key: str, default: int, minimum: int) -> int:
            raw = lowered.get(key)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"jetstream source: option {key} must be an integer, got {raw!r}") from None
            if value < minimum:
                raise ValueError(f"jetstream source: option {key} must be >= {minimum}, got {value}")
            return value

        end = number("end_seq", 0, 0)
        return cls(
            connection=_connection(lowered),
            stream=lowered["stream"],
            start_seq=number("start_seq", 1, 1),
            end_seq=end if lowered.get("end_seq") not in (None, "") else None,
            partitions=number("partitions", 1, 1),
            subject=lowered.get("subject") or None,
            batch=number("batch", 1000, 1),
            chunk_rows=number("chunk_rows", 10_000, 1),
            idle_timeout=float(lowered.get("idle_timeout") or 30.0),
        )


def _connection(options: Mapping[str, str]) -> NatsConnection:
    try:
        return NatsConnection.from_options(options)
    except ValueError as err:
        text = str(err)
        raise ValueError(text if text.startswith("jetstream source") else f"jetstream source: {text}") from None


class SequenceRange(InputPartition):
    """One partition: stream sequences `start..end`, inclusive."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


async def _resolve_range(options: ReadOptions) -> tuple[int, int]:
    """Clamp the requested range to what the stream holds now; the end is fixed for the whole read."""
    nc = await connect(options.connection, name="fleet-health-planner")
    try:
        bounds = await stream_bounds(nc, options.stream)
    finally:
        await nc.close()
    start = max(options.start_seq, bounds.first_seq, 1)
    end = bounds.last_seq if options.end_seq is None else min(options.end_seq, bounds.last_seq)
    return start, end


def plan_partitions(start: int, end: int, partitions: int) -> list[SequenceRange]:
    # PySpark needs at least one partition; an empty range reads nothing.
    ranges = split_range(start, end, partitions) or [(start, start - 1)]
    return [SequenceRange(lo, hi) for lo, hi in ranges]


def to_record_batch(columns: Columns, schema: pa.Schema) -> pa.RecordBatch:
    arrays = [
        pa.array(columns.sequence, type=schema.field("sequence").type),
        pa.array(columns.subject, type=schema.field("subject").type),
        pa.array(columns.time_us, type=schema.field("time").type),
        pa.array(columns.headers, type=schema.field("headers").type),
        pa.array(columns.data, type=schema.field("data").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class JetStreamReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> list[InputPartition]:
        start, end = asyncio.run(_resolve_range(self.options))
        return list(plan_partitions(start, end, self.options.partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange)
        if partition.end < partition.start:
            return
        opts = self.options
        # A plain loop, not asyncio.Runner: Runner.run re-installs a SIGINT handler on every call and
        # formats the task's repr (with all buffered rows) when doing so.
        loop = asyncio.new_event_loop()
        try:
            nc = loop.run_until_complete(connect(opts.connection, name=f"fleet-health-{partition.start}"))
            reader = RangeReader(
                nc,
                opts.stream,
                partition.start,
                partition.end,
                batch=opts.batch,
                filter_subject=opts.subject,
                idle_timeout=opts.idle_timeout,
            )
            try:
                loop.run_until_complete(reader.open())
                while (chunk := loop.run_until_complete(reader.next_chunk(opts.chunk_rows))) is not None:
                    yield to_record_batch(chunk, self.arrow_schema)
            finally:
                loop.run_until_complete(reader.close())
                loop.run_until_complete(nc.close())
        finally:
            loop.close()


class JetStreamDataSource(DataSource):
    """Register with `spark.dataSource.register(JetStreamDataSource)`, then `format("jetstream")`."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if schema != SCHEMA:
            raise ValueError(f"jetstream source: the schema is fixed ({SCHEMA.simpleString()})")
        return JetStreamReader(ReadOptions.parse(self.options), schema)
