"""Start-up faults: servers unreachable when the process starts, and a stop request meanwhile.

A replicator started before its servers must keep trying (Kubernetes starts pods in any order),
connect as soon as they come up, and still obey SIGTERM while it waits, promptly and cleanly.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.copier.helpers import make_stream, publish_many, spawn, stop, topic_config, write_config
from tests.support.faults import wait_count, wait_log


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_servers_down_at_start_then_up(tmp_path: Path, source_server: LocalNatsServer,
                                             target_server: LocalNatsServer, source_nc: Client,
                                             target_nc: Client) -> None:
    """Both servers are down when the process starts; it retries until they are up, then copies."""
    await make_stream(source_nc)
    await publish_many(source_nc, 500)
    source_server.stop()
    target_server.stop()
    path = write_config(tmp_path / "sr.yaml", topic_config(source_server.url, target_server.url))
    log = tmp_path / "worker.log"
    proc = spawn(path, log_path=log)
    try:
        assert await wait_log(log, "source connection", 15) is not None, "no retry logged"
        await asyncio.sleep(2)
        assert proc.poll() is None, f"gave up on unreachable servers:\n{log.read_text()[-2000:]}"
        await asyncio.to_thread(source_server.start)
        await asyncio.to_thread(target_server.start)
        assert await wait_count(target_nc, "FLEET", 500, 30) is not None, log.read_text()[-3000:]
    finally:
        assert stop(proc) == 0


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sigterm_while_the_servers_are_unreachable(tmp_path: Path) -> None:
    """Still connecting (nothing listens on the ports), SIGTERM ends the process in a second, exit 0."""
    path = write_config(tmp_path / "sr.yaml", topic_config(f"nats://127.0.0.1:{free_port()}",
                                                           f"nats://127.0.0.1:{free_port()}"))
    log = tmp_path / "worker.log"
    proc = spawn(path, log_path=log)
    time.sleep(3)
    assert proc.poll() is None
    began = time.monotonic()
    code = stop(proc, timeout=20)
    took = time.monotonic() - began
    output = log.read_text()
    assert took < 5, f"{took:.1f}s to stop while connecting"
    assert code == 0, output[-3000:]
    assert "Traceback" not in output


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_sigterm_while_stream_set_up_retries_with_the_servers_gone(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    """Connected, but the source stream does not exist yet (stream set-up retrying), then both
    servers go away: SIGTERM still ends the process at once, exit 0, with one log line for the
    stop and no traceback."""
    path = write_config(tmp_path / "sr.yaml", topic_config(source_server.url, target_server.url))
    log = tmp_path / "worker.log"
    proc = spawn(path, log_path=log)
    try:
        assert await wait_log(log, "no source stream captures subject", 15) is not None, log.read_text()
        await asyncio.to_thread(source_server.stop)
        await asyncio.to_thread(target_server.stop)
        await asyncio.sleep(2)
        assert proc.poll() is None
        before = log.stat().st_size
        began = time.monotonic()
        code = stop(proc, timeout=20)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            stop(proc, kill=True)
    after = log.read_bytes()[before:].decode().splitlines()
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert took < 5, f"{took:.1f}s to stop while setting up streams"
    assert "Traceback" not in output and "Task exception" not in output, output[-3000:]
    # A reconnect attempt may fail (and say so) in the instant between measuring the log and the
    # signal's arrival: the servers are gone and the client retries every second.
    after = [line for line in after if not ("WARNING" in line and " connection " in line and " error: " in line)]
    assert len(after) == 1 and "stopped" in after[0], after
