"""A worker imports nats-py without aiohttp, and still dials a `ws://` URL (nats-py's WebSocket
transport gets aiohttp back at its first use)."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.copier.helpers import indices, make_stream, publish_many, read_all, spawn, stop, topic_config, write_config
from tests.support.faults import log_text, wait_count


async def test_a_worker_copies_from_a_websocket_url(tmp_path: Path, target_server: LocalNatsServer,
                                                   target_nc: Client) -> None:
    ws_port = free_port()
    source = LocalNatsServer(name="source", store_dir=tmp_path / "source",
                             extra_config=f"websocket {{\n  listen: \"127.0.0.1:{ws_port}\"\n  no_tls: true\n}}")
    source.start()
    try:
        from nats import connect

        nc = await connect(source.url)
        await make_stream(nc)
        await publish_many(nc, 500)
        await nc.close()
        config = write_config(tmp_path / "sr.yaml", topic_config(f"ws://127.0.0.1:{ws_port}", target_server.url))
        log = tmp_path / "worker.log"
        proc = spawn(config, log_path=log)
        try:
            assert await wait_count(target_nc, "FLEET", 500, 30) is not None, log_text(log)
        finally:
            assert stop(proc) == 0
        assert indices(await read_all(target_nc, "FLEET")) == list(range(500))
    finally:
        source.close()
