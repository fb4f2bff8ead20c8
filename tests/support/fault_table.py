"""The fault suite's results table, gathered from the test reports so it works under pytest-xdist.

Each fault test leaves its `Outcome` rows in its report's `user_properties`; the process that
prints the summary (the xdist controller, or the only process) collects them from the reports it
receives, so the table is whole however the tests were spread over workers.
"""

from __future__ import annotations

import pytest

PROPERTY = "fault_outcome"
HEADER = ("scenario", "faults", "messages", "lost", "duplicated", "out of order", "recover (s)", "notes")
ROWS: list[tuple[str, ...]] = []


def results_table(rows: list[tuple[str, ...]]) -> str:
    """A Markdown table, aligned so it also reads well in a terminal."""
    body = [HEADER, *rows]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in body]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        ROWS.extend(tuple(value) for name, value in report.user_properties if name == PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    if not ROWS:
        return
    table = results_table(sorted(ROWS))
    terminalreporter.write_sep("=", "fault scenarios (RESULTS.md)")
    terminalreporter.write_line(table)
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    if cache is not None:
        path = cache.mkdir("stream-replicator") / "fault-results.md"
        path.write_text("# Fault scenarios\n\n" + table + "\n")
        terminalreporter.write_line(f"(written to {path})")
