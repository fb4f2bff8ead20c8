"""`stream-replicator demo` end to end, as `make demo` runs it (smaller and faster): the tree of four
real servers, fleet health on Spark while the fleet publishes, the tables and the HTML report; and
none of Spark's start-up noise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NODES = 30  # per city
NOISE = ("WARNING: Using incubator modules", "Using Spark's default log4j profile", "Setting default log level",
         "To adjust logging level", "NativeCodeLoader", "Traceback", "ERROR")


@pytest.mark.timeout(400)
def test_demo_runs_the_tree_and_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "out" / "fleet.html"
    done = subprocess.run(
        [sys.executable, "-m", "replicator", "demo", "--nodes", str(NODES), "--duration", "10", "--interval", "1",
         "--age", "4", "--fleet-every", "4", "--report", str(report)],
        capture_output=True, text=True, timeout=380)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for noise in NOISE:
        assert noise not in out and noise not in done.stderr, f"{noise!r} printed:\n{out}\n{done.stderr}"
    assert done.stderr == "", done.stderr

    for server in ("ams", "fra", "region", "centre"):
        assert re.search(rf"^{server} +NATS nats://127\.0\.0\.1:\d+$", out, re.M), out
    assert "tree: ams + fra -> region (ordered, every message) -> centre (sampled per city" in out
    progress = re.findall(r"^\[ *[\d.]+s\] published +(\d+) +region +(\d+) +centre +(\d+)", out, re.M)
    assert progress, out
    # Every registration reached the region (ordered, unsampled); the centre got each node at least once.
    summary = re.search(r"cities published (\d+) registrations \(ams (\d+), fra (\d+)\); the region holds (\d+), "
                        r"the centre (\d+) .* and (\d+) advisories", out)
    assert summary, out
    published, ams, fra, region, centre, advisories = map(int, summary.groups())
    assert published == ams + fra == region and ams > 0 and fra > 0
    assert 2 * NODES <= centre < published and advisories >= 2 * NODES

    runs = re.findall(r"^  fleet health run (\d+) at [\d:]+Z: availability", out, re.M)
    assert len(runs) >= 2 and runs == [str(n) for n in range(1, len(runs) + 1)], out  # one while publishing
    table = out[out.index("site             nodes"):]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:4]}
    assert set(rows) == {"ams", "fra"} and all(int(r[1]) == NODES for r in rows.values()), table
    assert re.search(rf"^fleet \(2 sites\) +{2 * NODES} ", table, re.M), table

    reported = re.search(r"^report \((\d+) fleet-health runs, (\d+) nodes\): (.+)$", out, re.M)
    assert reported, out
    assert (int(reported[1]), int(reported[2]), Path(reported[3])) == (len(runs), 2 * NODES, report.resolve())
    page = report.read_text()
    assert page.count('class="plotly-graph-div"') == 2 and "node00000.ams.example.net" in page
