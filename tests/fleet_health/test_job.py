"""End to end: advisories on a real stream -> Spark job -> Parquet tables and the KV summary."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from pyspark.sql import SparkSession

from replicator.cli.main import main as cli_main
from replicator.demo.local_nats import LocalNatsServer
from replicator.fleet_health.advisories import EVENT_SCHEMA
from replicator.fleet_health.cli import add_arguments, run_from_args
from replicator.fleet_health.history import read_history
from replicator.fleet_health.job import FleetHealthResult, run_fleet_health
from replicator.fleet_health.report import format_tables
from replicator.fleet_health.transforms import NODE_COLUMNS
from tests.fleet_health.helpers import (
    BAD,
    DUPLICATES,
    EXPECTED_FLEET,
    EXPECTED_NODES,
    EXPECTED_SITES,
    MESSAGES,
    NOW,
    T0,
    VALID,
    node_tuples,
    publish,
    read_summary,
    site_tuples,
)
from tests.support import browser

pytestmark = pytest.mark.spark

# dc1/n1 and dc2/n4 are timed out across the cut; after it come the late n6 timeout (n6 recovered
# before the cut) and a duplicate of an advisory from before it. test_transforms splits at many more points.
CUTS = (23,)


async def _publish(url: str, stream: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if stream not in [s.config.name for s in await js.streams_info()]:
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        await publish(nc, payloads, subject=f"{stream.lower()}.cmdb")
    finally:
        await nc.close()


async def _kv_entries(url: str, bucket: str) -> dict[str, dict[str, object]]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        out = {}
        for key in await kv.keys():
            entry = await kv.get(key)
            out[key] = json.loads(entry.value or b"null")
        return out
    finally:
        await nc.close()


def _write_orphan_of_run_2(spark: SparkSession, output: Path) -> None:
    """What a run 2 that died before committing leaves: events that must not count as seen."""
    fake = spark.createDataFrame(
        [(999, "ev-13", "new", "sender", "n6", 0, T0, "edge/west 1", "acme.cmdb", T0)], EVENT_SCHEMA
    )
    fake.write.parquet(str(output / "events" / "run=2"))
    fake.write.parquet(str(output / "state" / "run=2" / "nodes"))


@dataclass
class Runs:
    server: LocalNatsServer
    full: FleetHealthResult
    full_output: Path
    chain: list[FleetHealthResult]
    chain_output: Path
    cli_stdout: str


@pytest.fixture(scope="module")
def runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    server = LocalNatsServer(name="fleet-health", store_dir=tmp_path_factory.mktemp("js")).start()
    base = tmp_path_factory.mktemp("out")
    try:
        asyncio.run(_publish(server.url, "FULL", MESSAGES))
        full = run_fleet_health(server.url, "FULL", str(base / "full"), kv_bucket="FH_FULL", now=NOW, spark=spark)

        chain_out = base / "chain"
        chain = []
        bounds = [0, *CUTS, len(MESSAGES)]
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            asyncio.run(_publish(server.url, "CHAIN", MESSAGES[lo:hi]))
            if i == 1:
                _write_orphan_of_run_2(spark, chain_out)
            run_now = NOW if hi == len(MESSAGES) else T0 + 3000 * (i + 1)
            chain.append(
                run_fleet_health(server.url, "CHAIN", str(chain_out), kv_bucket="FH_CHAIN", now=run_now, spark=spark)
            )
        # One more run through the CLI, with nothing new to read.
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(
            [
                "--url",
                server.url,
                "--subject",  # the stream is found by the advisory subject
                "chain.cmdb",
                "--output",
                str(chain_out),
                "--kv-bucket",
                "FH_CHAIN",
                "--now",
                str(NOW),
            ]
        )
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert run_from_args(args) == 0
        yield Runs(server, full, base / "full", chain, chain_out, stdout.getvalue())
    finally:
        server.close()


def _nodes(spark: SparkSession, output: Path) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in spark.read.parquet(str(output / "nodes")).select(*NODE_COLUMNS).collect())


def test_full_run_counts_and_tables(spark: SparkSession, runs: Runs) -> None:
    r = runs.full
    assert (r.run, r.first_sequence, r.last_sequence, r.read) == (1, 1, len(MESSAGES), len(MESSAGES))
    assert (r.events, r.duplicates, r.malformed) == (VALID, DUPLICATES, BAD)
    assert r.totals == {"advisories": VALID, "duplicates": DUPLICATES, "malformed": BAD}
    nodes = spark.read.parquet(str(runs.full_output / "nodes")).collect()
    assert node_tuples(nodes) == sorted(EXPECTED_NODES)
    assert site_tuples(r.sites) == EXPECTED_SITES
    assert r.fleet == pytest.approx(EXPECTED_FLEET)
    sites = spark.read.parquet(str(runs.full_output / "sites")).orderBy("replicator").collect()
    assert site_tuples([s.asDict() for s in sites]) == EXPECTED_SITES
    fleet = spark.read.parquet(str(runs.full_output / "fleet")).first()
    assert fleet is not None and fleet.asDict() == pytest.approx(EXPECTED_FLEET)


def test_chain_of_incremental_runs_equals_the_full_run(spark: SparkSession, runs: Runs) -> None:
    third = runs.chain[-1]
    assert [c.run for c in runs.chain] == [1, 2]
    assert [(c.first_sequence, c.last_sequence) for c in runs.chain] == [
        (1, CUTS[0]),
        (CUTS[0] + 1, len(MESSAGES)),
    ]
    assert [c.duplicates for c in runs.chain] == [1, 2]
    assert sum(c.read for c in runs.chain) == len(MESSAGES)
    assert third.totals == runs.full.totals
    assert _nodes(spark, runs.chain_output) == _nodes(spark, runs.full_output)
    assert third.sites == runs.full.sites and third.fleet == runs.full.fleet


def test_a_run_with_nothing_new_changes_nothing(spark: SparkSession, runs: Runs) -> None:
    assert "run 3" in runs.cli_stdout and "read 0 advisories" in runs.cli_stdout
    assert _nodes(spark, runs.chain_output) == _nodes(spark, runs.full_output)
    # Only the current and the previous snapshots are kept.
    assert sorted(p.name for p in (runs.chain_output / "state").iterdir()) == ["run=2", "run=3"]
    assert sorted(p.name for p in (runs.chain_output / "events").iterdir() if p.is_dir()) == [
        "run=1",
        "run=2",
        "run=3",
    ]


def test_kv_summary_read_back(runs: Runs) -> None:
    summary = asyncio.run(read_summary(runs.server.url, "FH_FULL"))
    assert summary == runs.full.summary
    assert summary["last_run"] == NOW and summary["last_sequence"] == len(MESSAGES)
    assert (summary["advisories"], summary["duplicates"], summary["malformed"]) == (VALID, DUPLICATES, BAD)
    assert summary["fleet"] == {**EXPECTED_FLEET, "availability": round(5 / 7, 6)}
    assert [s["replicator"] for s in summary["sites"]] == ["dc1", "dc2", "edge/west 1"]

    entries = asyncio.run(_kv_entries(runs.server.url, "FH_CHAIN"))
    assert set(entries) == {"summary", "site.dc1", "site.dc2", "site.edge=2Fwest=201"}
    edge = entries["site.edge=2Fwest=201"]
    assert edge["replicator"] == "edge/west 1" and edge["nodes"] == 3 and edge["availability"] == 1.0
    assert edge["last_run"] == NOW and edge["run"] == 3
    chained = entries["summary"]
    assert chained["run"] == 3 and chained["malformed"] == BAD and chained["fleet"] == summary["fleet"]


def test_format_tables(runs: Runs) -> None:
    text = format_tables(runs.full)
    lines = text.splitlines()
    assert lines[0].startswith("Fleet health run 1 at 2023-11-15 01:00:00Z: stream FULL up to sequence 31")
    assert lines[2].split() == ["site", "nodes", "healthy", "timeout", "expired", "unknown", "availability"]
    assert lines[4].split() == ["dc1", "3", "1", "1", "1", "0", "50.00%"]
    assert lines[6].split() == ["edge/west", "1", "3", "3", "0", "0", "0", "100.00%"]
    assert lines[-1].split() == ["fleet", "(3", "sites)", "8", "5", "2", "1", "0", "71.43%"]
    assert runs.cli_stdout.splitlines()[-1].split() == lines[-1].split()


# ---- the history read back for pictures (`fleet-health report --html`)


def test_history_rebuilds_each_runs_site_table(runs: Runs) -> None:
    """Per run, each site's counts rebuilt from the events equal the site table that run wrote
    (the late advisory in run 2 included), and the run log reads back."""
    history = read_history(str(runs.chain_output))
    assert [r.run for r in history.runs] == [1, 2, 3] and history.stream == "CHAIN"
    wrote = [*(c.sites for c in runs.chain), runs.chain[-1].sites]  # run 3 read nothing new
    for index, sites in enumerate(wrote):
        rebuilt = [(site, c[index].nodes, c[index].healthy, c[index].timeout, c[index].expired, c[index].availability)
                   for site, c in history.sites.items() if c[index].nodes]
        assert rebuilt == site_tuples(sites), f"run {index + 1}"
    assert [(r.read, r.events, r.duplicates, r.malformed) for r in history.runs] == [
        (c.read, c.events, c.duplicates, c.malformed) for c in runs.chain] + [(0, 0, 0, 0)]
    assert [sum(r.by_event.values()) for r in history.runs] == [c.events for c in runs.chain] + [0]
    assert sorted((n["replicator"], n["value"], n["state"]) for n in history.nodes) == sorted(
        (n[0], n[1], n[2]) for n in EXPECTED_NODES)


@pytest.mark.skipif(browser.CHROMIUM is None, reason="chromium is not installed (Debian package chromium; "
                                                     ".ci/run installs it)")
def test_html_report_in_a_real_browser(runs: Runs, tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    page = tmp_path / "report" / "fleet.html"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["fleet-health", "report", "--output", str(runs.chain_output), "--html", str(page),
                         "--max-nodes", "5"])
    assert code == 0 and str(page) in out.getvalue()
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text  # nothing to fetch: plotly.js is inline
    assert "The 5 least healthy of 8 nodes" in text

    seen = browser.visit(page, width=1280, height=1400)
    assert seen.errors == [] and seen.remote_requests == [], (seen.errors, seen.remote_requests)
    assert seen.requests == [page.as_uri()] and seen.title == "Fleet health"
    image = Image.open(io.BytesIO(seen.screenshot)).convert("RGB")
    assert image.size == (1280, 1400)
    grey = image.convert("L")
    inked = sum(grey.histogram()[:200]) / (image.width * image.height)  # pixels clearly darker than white
    colours = len(image.getcolors(maxcolors=1 << 16) or range(1 << 16))
    assert inked > 0.02 and ImageStat.Stat(grey).stddev[0] > 10 and colours > 50, (inked, colours)
    # The charts were drawn: plotly renders SVG into its divs, one per chart with its traces.
    assert text.count('class="plotly-graph-div"') == 2


@pytest.mark.skipif(browser.CHROMIUM is None, reason="chromium is not installed")
def test_browser_check_sees_errors_and_network_requests(tmp_path: Path) -> None:
    """The check above would catch a page that fetches or fails (no address is reachable from it)."""
    page = tmp_path / "bad.html"
    page.write_text('<html><head><script src="https://cdn.invalid/plotly.min.js"></script></head><body>'
                    '<script>console.error("boom"); undefinedFunction();</script></body></html>')
    seen = browser.visit(page, settle=0.5)
    assert seen.remote_requests == ["https://cdn.invalid/plotly.min.js"]
    assert any("boom" in e for e in seen.errors) and any("undefinedFunction" in e for e in seen.errors)


def test_report_of_a_folder_without_runs_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["fleet-health", "report", "--output", str(tmp_path), "--html", str(tmp_path / "x.html")]) == 2
    assert "no committed fleet-health run under" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
