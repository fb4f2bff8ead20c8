"""The demo's fleet health: the Spark job run every few seconds while the fleet publishes, as the
operator's schedule would run it, so the report has a history to draw.

Spark starts in a thread (`ready` once its JVM is up: the demo waits for it, so that runs happen
while the fleet publishes); from `begin` on, a run every `every` seconds, each incremental over the
centre's advisory stream and printed as one line. `finish` makes the last run, after replication
stopped. PySpark (and Plotly for the report) are extras: without them the demo says so and goes on.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write: lines from this thread do not split the progress lines
    sys.stdout.flush()


def run_line(result: Any) -> str:
    fleet = result.fleet
    when = dt.datetime.fromtimestamp(result.run_time, dt.UTC).strftime("%H:%M:%SZ")
    availability = "-" if fleet["availability"] is None else f"{100 * fleet['availability']:.1f}%"
    return (f"  fleet health run {result.run} at {when}: availability {availability} over {fleet['nodes']} nodes "
            f"({fleet['healthy']} healthy, {fleet['timeout']} timeout, {fleet['expired']} expired), "
            f"{result.events} new advisories")


class PeriodicFleetHealth:
    def __init__(self, url: str, stream: str, output: Path, every: float, *, verbose: bool = False) -> None:
        self.url, self.stream, self.output, self.every, self.verbose = url, stream, output, every, verbose
        self.results: list[Any] = []
        self.unavailable: str | None = None
        self.ready = threading.Event()  # Spark is up, or `unavailable` says why not
        self._begin = threading.Event()
        self._started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="fleet-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def begin(self) -> None:
        """The fleet starts publishing: the schedule's clock starts now."""
        self._started = time.monotonic()
        self._begin.set()

    def finish(self, timeout: float = 600) -> Any | None:
        """The last run, over everything the centre holds now; its result (None if none succeeded)."""
        self._begin.set()
        self._stop.set()
        self._thread.join(timeout)
        return self.results[-1] if self.results else None

    def _work(self) -> None:
        try:
            from replicator.fleet_health.job import run_fleet_health
            from replicator.fleet_health.session import spark_session
        except ImportError as err:  # PySpark is an extra: the demo still shows replication without it
            self.unavailable = f"{err} (install with: pip install 'stream-replicator[spark]')"
            self.ready.set()
            return
        try:
            session = spark_session("local[2]", quiet=not self.verbose)
        except Exception as err:  # no Java, say
            self.unavailable = f"Spark did not start: {type(err).__name__}: {err}"
            self.ready.set()
            return
        self.ready.set()
        self._begin.wait()
        started = self._started or time.monotonic()
        try:
            while True:  # on the clock since the demo began (a slow run skips a slot, as a schedule would)
                now = time.monotonic()
                stopping = self._stop.wait(started + self.every * ((now - started) // self.every + 1) - now)
                try:
                    result = run_fleet_health(self.url, self.stream, str(self.output), partitions=2, spark=session)
                except Exception as err:  # one failed run is reported; the next one retries it
                    _say(f"  fleet health run failed: {type(err).__name__}: {err}")
                else:
                    self.results.append(result)
                    _say(run_line(result))
                if stopping:
                    return
        finally:
            session.stop()
