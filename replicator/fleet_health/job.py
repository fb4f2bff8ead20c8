"""One fleet-health run: read new advisories, fold them into the stored state, write tables and summary."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from replicator.fleet_health.advisories import blind_spots, parse_advisories, valid_events
from replicator.fleet_health.connection import NatsConnection, as_connection, connect
from replicator.fleet_health.jetstream import StreamBounds, stream_bounds
from replicator.fleet_health.session import spark_session
from replicator.fleet_health.source import SOURCE_NAME
from replicator.fleet_health.store import OutputStore, RunRecord, Snapshot
from replicator.fleet_health.summary import DEFAULT_BUCKET, build_summary, publish_summary
from replicator.fleet_health.transforms import advance_nodes, fleet_table, new_events, node_table, site_table

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetHealthResult:
    """What a run did (`read`..`malformed` are this run's, `totals` cover every run) and the tables."""

    run: int
    run_time: int
    stream: str
    output: str
    kv_bucket: str
    first_sequence: int | None
    last_sequence: int
    read: int
    events: int
    duplicates: int
    malformed: int
    totals: dict[str, int]
    fleet: dict[str, Any]
    sites: list[dict[str, Any]]
    summary: dict[str, Any]


async def _bounds(connection: NatsConnection, stream: str) -> StreamBounds:
    nc = await connect(connection, name="fleet-health-driver")
    try:
        return await stream_bounds(nc, stream)
    finally:
        await nc.close()


def _read_range(spark: SparkSession, options: dict[str, str | None]) -> DataFrame:
    reader = spark.read.format(SOURCE_NAME)
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, value)
    return reader.load()


def _sequence_range(previous: Snapshot | None, bounds: StreamBounds, stream: str) -> tuple[int, int]:
    """From just after the last processed sequence to the stream's end, as stored now."""
    done = previous.last_sequence if previous else 0
    start = max(done + 1, bounds.first_seq)
    if start > done + 1 and done:
        log.warning(
            "stream %s lost sequences %d..%d before they were read (limits or purge)",
            stream,
            done + 1,
            start - 1,
        )
    if bounds.last_seq < done:
        log.warning(
            "stream %s ends at %d, before the last processed sequence %d: was it recreated?",
            stream,
            bounds.last_seq,
            done,
        )
    return start, bounds.last_seq


def run_fleet_health(
    url: NatsConnection | str,
    stream: str,
    output: str,
    *,
    kv_bucket: str = DEFAULT_BUCKET,
    partitions: int = 2,
    master: str | None = "local[2]",
    now: int | None = None,
    credentials: str | None = None,
    subject: str | None = None,
    spark: SparkSession | None = None,
    quiet: bool = False,
) -> FleetHealthResult:
    """Process the advisories appended since the last run; see docs/fleet-health.md.

    `spark` (or an already active session) is used and left running; otherwise one is built for
    `master` (None: whatever spark-submit set) and stopped at the end. `now` (unix s) is the run's
    clock for downtime. `subject` reads only that subject of the stream. `quiet`: a JVM started
    here does not print its start-up noise. `url` is a URL (with an optional `credentials` file)
    or a `NatsConnection` (TLS, JWT + nkey seed, ...).
    """
    connection = as_connection(url, credentials)
    run_time = int(time.time()) if now is None else int(now)
    # First, before Spark starts or anything is written: bad TLS material or credentials end the run
    # here with the reason, and the output is left as it was.
    bounds = asyncio.run(_bounds(connection, stream))
    owned = spark is None and SparkSession.getActiveSession() is None
    session = spark or spark_session(master, quiet=quiet)
    cached: list[DataFrame] = []
    try:
        store = OutputStore(session, output)
        previous = store.latest()
        start, end = _sequence_range(previous, bounds, stream)
        run = previous.run + 1 if previous else 1

        source: dict[str, str | None] = {
            **connection.options(),
            "stream": stream,
            "start_seq": str(start),
            "end_seq": str(end),
            "partitions": str(partitions),
            "subject": subject,
        }
        parsed = parse_advisories(_read_range(session, source)).persist()
        cached.append(parsed)
        counts = parsed.agg(
            F.count(F.lit(1)).alias("read"),
            F.coalesce(F.sum(F.col("valid").cast("long")), F.lit(0)).alias("valid"),
            F.coalesce(F.sum(F.col("other").cast("long")), F.lit(0)).alias("other"),
            F.count(F.col("spot_from")).alias("spots"),
            F.min("sequence").alias("first"),
        ).first()
        assert counts is not None
        read, valid, other = int(counts["read"]), int(counts["valid"]), int(counts["other"])
        if int(counts["spots"]):
            store.write_blind_spots(run, blind_spots(parsed))

        history = store.history(previous.run) if previous else None
        events = new_events(valid_events(parsed), history).persist()
        cached.append(events)
        new = events.count()
        store.write_events(run, events)

        state = advance_nodes(store.state(previous.run) if previous else None, events, history)
        nodes = store.write_nodes(run, node_table(state, run_time, store.blind_spots(run)))
        site_df, fleet_df = site_table(nodes), fleet_table(nodes)
        site_rows, fleet_rows = site_df.collect(), fleet_df.collect()
        sites = [row.asDict() for row in site_rows]
        fleet = fleet_rows[0].asDict()

        record = RunRecord(
            run=run,
            run_time=run_time,
            stream=stream,
            first_sequence=int(counts["first"]) if counts["first"] is not None else None,
            last_sequence=max(end, previous.last_sequence if previous else 0),
            read=read,
            events=new,
            duplicates=valid - new,
            malformed=read - valid - other,
        )
        snapshot = Snapshot(run=run, runs=(*(previous.runs if previous else ()), record))
        store.commit(snapshot)
        # The small tables again from the collected rows: no second aggregation over the nodes.
        store.publish(
            run,
            session.createDataFrame(site_rows, site_df.schema),
            session.createDataFrame(fleet_rows, fleet_df.schema),
        )
        store.prune(run)

        totals = {
            "advisories": snapshot.total("events"),
            "duplicates": snapshot.total("duplicates"),
            "malformed": snapshot.total("malformed"),
        }
        summary = build_summary(
            stream=stream,
            run=run,
            run_time=run_time,
            last_sequence=record.last_sequence,
            fleet=fleet,
            sites=sites,
            totals=totals,
        )
        asyncio.run(publish_summary(connection, kv_bucket, summary))
        log.info("fleet health run %d: read %d advisories up to sequence %d", run, read, record.last_sequence)
        return FleetHealthResult(
            run=run,
            run_time=run_time,
            stream=stream,
            output=output,
            kv_bucket=kv_bucket,
            first_sequence=record.first_sequence,
            last_sequence=record.last_sequence,
            read=read,
            events=new,
            duplicates=record.duplicates,
            malformed=record.malformed,
            totals=totals,
            fleet=fleet,
            sites=sites,
            summary=summary,
        )
    finally:
        for df in cached:
            df.unpersist()
        if owned:
            session.stop()
