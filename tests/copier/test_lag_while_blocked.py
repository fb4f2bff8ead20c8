"""The lag gauge while the target is down: it keeps rising as the source receives, and falls once
the target is back, as scraped from the worker's metrics port (the alerts on a growing lag read it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.copier.helpers import make_stream, publish_many, spawn, stop, topic_config, wait_for_count, write_config
from tests.support.faults import scrape

SCALED = {"workers": 2, "queue_group": "lag_grp", "name": None}


def _lag(port: int) -> float | None:
    """The highest `stream_replicator_lag_msgs` among the process's workers (None: not yet exported)."""
    try:
        text = scrape(port)
    except OSError:
        return None
    values = [float(line.rpartition(" ")[2]) for line in text.splitlines()
              if line.startswith("stream_replicator_lag_msgs{")]
    return max(values) if values else None


async def _until_lag(port: int, ok: Callable[[float], bool], what: str, within: float) -> float:
    deadline = time.monotonic() + within
    seen = None
    while time.monotonic() < deadline:
        seen = await asyncio.to_thread(_lag, port)
        if seen is not None and ok(seen):
            return seen
        await asyncio.sleep(0.3)
    raise AssertionError(f"stream_replicator_lag_msgs never became {what} within {within}s (last {seen})")


@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_lag_rises_while_the_target_is_down_and_falls_after(
    mode, tmp_path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc, target_nc
):
    await make_stream(source_nc)
    await publish_many(source_nc, 100)
    port = free_port()
    extra = SCALED if mode == "scaled" else {}
    config = write_config(tmp_path / "sr.yaml", topic_config(source_server.url, target_server.url, monitor=port,
                                                             max_in_flight=20, **extra))
    proc = spawn(config, log_path=tmp_path / "worker.log")
    try:
        assert await wait_for_count(target_nc, "FLEET", 100, timeout=30) == 100
        await _until_lag(port, lambda lag: lag == 0, "0", 20)

        await asyncio.to_thread(target_server.stop)
        await publish_many(source_nc, 200, start=100)
        # Every message not copied counts, those held in the window too.
        first = await _until_lag(port, lambda lag: lag >= 200, ">= 200", 30)
        await publish_many(source_nc, 200, start=300)
        assert await _until_lag(port, lambda lag: lag >= 400, ">= 400", 30) > first

        await asyncio.to_thread(target_server.start)
        assert await wait_for_count(target_nc, "FLEET", 500, timeout=60) == 500
        await _until_lag(port, lambda lag: lag == 0, "0", 30)
    finally:
        assert stop(proc) == 0
