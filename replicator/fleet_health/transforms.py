"""Pure DataFrame transforms: advisories -> per-node state -> node, site and fleet tables.

A node's history is folded in (event timestamp, stream sequence) order. The fold is incremental: the
previous run's state enters as a synthetic first step (its last event, plus the open timeout it
carries), so a chain of runs gives the same state as one run over everything. An advisory that
arrives after a later one of the same node was already folded (a lagging site) cannot be appended;
that node alone is replayed from its stored history instead.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

KEYS = ("replicator", "value")
HEALTHY, TIMEOUT, EXPIRED = "healthy", "timeout", "expired"
# A timeout judged while its replicator was not watching (inside one of its blind spots): the node may
# be down, or its messages merely unread or lost; the centre cannot tell, and says so.
UNKNOWN = "unknown"

# Per-node state carried between runs (the `nodes` table minus `downtime_seconds`, which needs a clock).
STATE_COLUMNS = (
    "replicator",
    "value",
    "state",
    "first_seen",
    "last_event",
    "last_event_time",
    "last_sequence",
    "timeouts",
    "recoveries",
    "expiries",
    "closed_downtime_seconds",
    "timeout_since",
)
NODE_COLUMNS = (
    "replicator",
    "value",
    "state",
    "first_seen",
    "last_event",
    "last_event_time",
    "timeouts",
    "recoveries",
    "expiries",
    "downtime_seconds",
    "timeout_since",
    "closed_downtime_seconds",
    "last_sequence",
)
COUNT_COLUMNS = ("nodes", "healthy", "timeout", "expired", "unknown")


def new_events(events: DataFrame, seen_ids: DataFrame | None = None) -> DataFrame:
    """The first occurrence (lowest sequence) of each `event_id` that `seen_ids` does not hold yet."""
    columns = events.columns
    # A hash aggregate, not a window: no sort of the whole batch by event_id.
    first = (
        events.groupBy("event_id")
        .agg(F.min_by(F.struct(*columns), F.col("sequence")).alias("_first"))
        .select("_first.*")
    )
    if seen_ids is not None:
        first = first.join(seen_ids.select("event_id"), "event_id", "left_anti")
    return first.select(*columns)


def _event_steps(events: DataFrame) -> DataFrame:
    event = F.col("event")
    return events.select(
        *KEYS,
        "sequence",
        "event",
        "timestamp",
        F.col("seen").alias("first_seen"),
        (event == "timeout").cast("long").alias("timeouts"),
        (event == "recover").cast("long").alias("recoveries"),
        (event == "expire").cast("long").alias("expiries"),
        F.lit(0).cast("long").alias("closed"),
        F.lit(None).cast("long").alias("timeout_since"),
        F.lit(False).alias("is_seed"),
    )


def _seed_steps(state: DataFrame) -> DataFrame:
    return state.select(
        *KEYS,
        F.col("last_sequence").alias("sequence"),
        F.col("last_event").alias("event"),
        F.col("last_event_time").alias("timestamp"),
        "first_seen",
        "timeouts",
        "recoveries",
        "expiries",
        F.col("closed_downtime_seconds").alias("closed"),
        "timeout_since",
        F.lit(True).alias("is_seed"),
    )


def _state_of(event: Column) -> Column:
    return (
        F.when(event.isin("new", "recover"), F.lit(HEALTHY))
        .when(event == "timeout", F.lit(TIMEOUT))
        .otherwise(F.lit(EXPIRED))
    )


def _fold(steps: DataFrame) -> DataFrame:
    """One row per node from its ordered steps; a timeout run lasts until the next non-timeout event."""
    ordered = Window.partitionBy(*KEYS).orderBy("timestamp", "sequence")
    upto_here = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    event, prev = F.col("event"), F.col("_prev")
    starts_run = (event == "timeout") & (prev.isNull() | (prev != "timeout"))
    steps = (
        steps.withColumn("_prev", F.lag("event").over(ordered))
        .withColumn(
            "_run_start",
            F.when(F.col("is_seed"), F.col("timeout_since")).when(starts_run, F.col("timestamp")),
        )
        .withColumn("_open_since", F.last("_run_start", ignorenulls=True).over(upto_here))
        .withColumn(
            "_closed",
            F.col("closed")
            + F.when(
                ~F.col("is_seed") & (event != "timeout") & (prev == "timeout"),
                F.col("timestamp") - F.col("_open_since"),
            ).otherwise(F.lit(0)),
        )
    )
    last = F.max_by(F.struct("event", "timestamp", "sequence", "_open_since"), F.struct("timestamp", "sequence"))
    folded = steps.groupBy(*KEYS).agg(
        F.min("first_seen").alias("first_seen"),
        F.sum("timeouts").alias("timeouts"),
        F.sum("recoveries").alias("recoveries"),
        F.sum("expiries").alias("expiries"),
        F.sum("_closed").alias("closed_downtime_seconds"),
        last.alias("_last"),
    )
    last_event = F.col("_last.event")
    return folded.select(
        *KEYS,
        _state_of(last_event).alias("state"),
        "first_seen",
        last_event.alias("last_event"),
        F.col("_last.timestamp").alias("last_event_time"),
        F.col("_last.sequence").alias("last_sequence"),
        "timeouts",
        "recoveries",
        "expiries",
        "closed_downtime_seconds",
        F.when(last_event == "timeout", F.col("_last._open_since")).alias("timeout_since"),
    )


def advance_nodes(previous: DataFrame | None, events: DataFrame, history: DataFrame | None) -> DataFrame:
    """Node state after `events`, given the state and the events (`history`) of earlier runs.

    `events` must already be deduplicated against `history` (see `new_events`). One small action
    checks for late advisories first, so the history is read only when a node must be replayed.
    """
    if previous is None:
        return _fold(_event_steps(events))
    previous = previous.select(*STATE_COLUMNS)
    e, p = events.alias("e"), previous.alias("p")
    late = (
        e.join(p, list(KEYS))
        .where(
            F.struct(F.col("e.timestamp"), F.col("e.sequence"))
            < F.struct(F.col("p.last_event_time"), F.col("p.last_sequence"))
        )
        .select(*KEYS)
        .distinct()
    )
    # Late nodes are rare: only then is the (large) history scanned.
    if late.isEmpty():
        return _fold(_seed_steps(previous).unionByName(_event_steps(events)))
    steps = _seed_steps(previous.join(late, list(KEYS), "left_anti")).unionByName(_event_steps(events))
    if history is not None:
        replay = history.select(*events.columns).join(late, list(KEYS), "left_semi")
        steps = steps.unionByName(_event_steps(replay))
    return _fold(steps)


def node_table(state: DataFrame, now: int, spots: DataFrame | None = None) -> DataFrame:
    """The `nodes` table as of `now` (unix s): an open timeout counts as downtime up to `now`. A
    timeout judged inside one of its replicator's blind spots (`spots`: `replicator`, `from`,
    `until`) is `unknown`: its time lies between `from` and `until`."""
    still_open = F.greatest(F.lit(0).cast("long"), F.lit(now).cast("long") - F.col("timeout_since"))
    downtime = F.col("closed_downtime_seconds") + F.when(F.col("state") == TIMEOUT, still_open).otherwise(F.lit(0))
    table = state.withColumn("downtime_seconds", downtime.cast("long"))
    if spots is not None:
        s = F.broadcast(spots.select(F.col("replicator").alias("_r"), F.col("from").alias("_f"),
                                     F.col("until").alias("_u")))
        t = table.alias("t")
        inside = (F.col("t.replicator") == F.col("_r")) & (F.col("t.timeout_since") >= F.col("_f")) & (
            F.col("t.timeout_since") <= F.col("_u"))
        blind = (t.where(F.col("t.state") == TIMEOUT).join(s, inside, "left_semi")
                 .select(*KEYS).withColumn("_blind", F.lit(True)))
        table = table.join(blind, list(KEYS), "left").withColumn(
            "state", F.when(F.col("_blind"), F.lit(UNKNOWN)).otherwise(F.col("state")))
    return table.select(*NODE_COLUMNS)


def _counts() -> list[Column]:
    state = F.col("state")
    return [
        F.count(F.lit(1)).alias("nodes"),
        F.coalesce(F.sum((state == HEALTHY).cast("long")), F.lit(0)).alias("healthy"),
        F.coalesce(F.sum((state == TIMEOUT).cast("long")), F.lit(0)).alias("timeout"),
        F.coalesce(F.sum((state == EXPIRED).cast("long")), F.lit(0)).alias("expired"),
        F.coalesce(F.sum((state == UNKNOWN).cast("long")), F.lit(0)).alias("unknown"),
    ]


def _availability() -> Column:
    """Healthy share of the nodes that are expected to report (expired ones are gone, unknown ones
    cannot be judged); null if none."""
    reporting = F.col("healthy") + F.col("timeout")
    return F.when(reporting > 0, F.col("healthy") / reporting).alias("availability")


def site_table(nodes: DataFrame) -> DataFrame:
    return (
        nodes.groupBy("replicator")
        .agg(*_counts())
        .select("replicator", *COUNT_COLUMNS, _availability())
        .orderBy("replicator")
    )


def fleet_table(nodes: DataFrame) -> DataFrame:
    return nodes.agg(F.countDistinct("replicator").alias("sites"), *_counts()).select(
        "sites", *COUNT_COLUMNS, _availability()
    )
