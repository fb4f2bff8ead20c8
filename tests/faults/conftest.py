"""Fault suite fixtures: the rig (servers behind proxies) and the session's results table.

Every scenario appends an `Outcome`; at the end of the session the table is printed in the
terminal summary (so `make test` shows it without `-s`) and written as Markdown under the pytest
cache, ready to paste into a release note.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from tests.faults.rig import Rig
from tests.support.faults import Outcome

RESULTS: list[Outcome] = []
HEADER = ("scenario", "faults", "messages", "lost", "duplicated", "out of order", "recover (s)", "notes")


@pytest.fixture(scope="session")
def fault_results() -> list[Outcome]:
    return RESULTS


@pytest.fixture
async def rig(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
    target_nc: Client,
) -> AsyncIterator[Rig]:
    rig = Rig(tmp_path, source_server, target_server, source_nc, target_nc, RESULTS)
    await rig.open()
    try:
        yield rig
    finally:
        await rig.close()


def results_table(rows: list[Outcome]) -> str:
    """A Markdown table, aligned so it also reads well in a terminal."""
    body = [HEADER, *(o.row() for o in rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in body]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    if not RESULTS:
        return
    table = results_table(RESULTS)
    terminalreporter.write_sep("=", "fault scenarios (RESULTS.md)")
    terminalreporter.write_line(table)
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    if cache is not None:
        path = cache.mkdir("stream-replicator") / "fault-results.md"
        path.write_text("# Fault scenarios\n\n" + table + "\n")
        terminalreporter.write_line(f"(written to {path})")
