from replicator.demo.local_nats import LocalNatsServer


async def test_two_independent_servers_with_jetstream(source_nc, target_nc, source_server, target_server):
    assert source_server.port != target_server.port
    js = source_nc.jetstream()
    await js.add_stream(name="S", subjects=["s.>"])
    await js.publish("s.1", b"x")
    assert (await js.stream_info("S")).state.messages == 1
    # The target knows nothing of the source's stream: they are separate clusters.
    names = await target_nc.jetstream().streams_info()
    assert names == []


def test_restart_keeps_the_store(tmp_path):
    server = LocalNatsServer(store_dir=tmp_path / "js").start()
    try:
        pid = server.process.pid
        server.restart()
        assert server.running and server.process.pid != pid
    finally:
        server.close()
    assert not server.running
