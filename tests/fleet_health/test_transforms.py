"""The pure transforms on the scripted history: expected tables, and incremental runs equal one run."""

from __future__ import annotations

import itertools

import pytest
from pyspark.sql import DataFrame, SparkSession

from replicator.fleet_health.advisories import parse_advisories, valid_events
from replicator.fleet_health.transforms import (
    advance_nodes,
    fleet_table,
    new_events,
    node_table,
    site_table,
)
from tests.fleet_health.helpers import (
    BAD,
    DUPLICATES,
    EXPECTED_FLEET,
    EXPECTED_NODES,
    EXPECTED_SITES,
    MESSAGES,
    NOW,
    VALID,
    node_tuples,
    site_tuples,
)

pytestmark = pytest.mark.spark


def raw(spark: SparkSession, first_seq: int, payloads: list[bytes]) -> DataFrame:
    rows = [(first_seq + i, bytearray(p)) for i, p in enumerate(payloads)]
    return spark.createDataFrame(rows, "sequence long, data binary")


def run_chain(spark: SparkSession, cuts: list[int]) -> DataFrame:
    """Fold MESSAGES in batches ending at `cuts`, as successive job runs would, and return the state."""
    state: DataFrame | None = None
    history: DataFrame | None = None
    bounds = [0, *cuts, len(MESSAGES)]
    for lo, hi in itertools.pairwise(bounds):
        parsed = parse_advisories(raw(spark, lo + 1, MESSAGES[lo:hi]))
        events = new_events(valid_events(parsed), history).localCheckpoint()
        state = advance_nodes(state, events, history).localCheckpoint()
        history = events if history is None else history.unionByName(events).localCheckpoint()
    assert state is not None
    return state


def test_parse_flags_malformed_and_keeps_valid(spark: SparkSession) -> None:
    parsed = parse_advisories(raw(spark, 1, MESSAGES))
    counts = {row["valid"]: row["count"] for row in parsed.groupBy("valid").count().collect()}
    assert counts == {True: VALID + DUPLICATES, False: BAD}
    events = new_events(valid_events(parsed))
    assert events.count() == VALID
    # The first copy of a duplicated event is kept.
    kept = {r.event_id: r.sequence for r in events.where("event_id in ('ev-2', 'ev-22')").collect()}
    assert kept == {"ev-2": 3, "ev-22": len(MESSAGES) - 1}


def test_scripted_history_gives_the_hand_computed_tables(spark: SparkSession) -> None:
    nodes = node_table(run_chain(spark, []), NOW)
    assert node_tuples(nodes.collect()) == sorted(EXPECTED_NODES)
    sites = [r.asDict() for r in site_table(nodes).collect()]
    assert site_tuples(sites) == EXPECTED_SITES
    fleet = fleet_table(nodes).first()
    assert fleet is not None
    assert fleet.asDict() == pytest.approx(EXPECTED_FLEET)


@pytest.mark.parametrize(
    "cuts",
    [
        [10],  # dc2/n1 and dc1/n1 timed out across the cut
        [22, 27],  # the late n6 timeout and a duplicate arrive after n6 recovered
        [1, 8, 15, 20, 29],
        list(range(6, len(MESSAGES), 6)),
    ],
    ids=lambda cuts: "cuts-" + "-".join(map(str, cuts)),
)
def test_incremental_runs_equal_one_run(spark: SparkSession, cuts: list[int]) -> None:
    chained = node_table(run_chain(spark, cuts), NOW)
    assert node_tuples(chained.collect()) == sorted(EXPECTED_NODES)


def test_downtime_of_an_open_timeout_follows_the_clock(spark: SparkSession) -> None:
    state = run_chain(spark, [])
    later = {(r.replicator, r.value): r.downtime_seconds for r in node_table(state, NOW + 100).collect()}
    assert later[("dc1", "n1")] == 8400
    assert later[("dc2", "n4")] == 9300
    assert later[("dc2", "n1")] == 600
