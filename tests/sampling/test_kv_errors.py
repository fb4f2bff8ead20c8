"""The KV store tells an unreachable server apart from a bug: an outage degrades it (counted, logged,
deciding from the cache), while a programming error propagates and is not reported as an outage."""

from __future__ import annotations

import logging

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from replicator.sampling.limiter import Limiter
from replicator.sampling.state import kv as kv_module
from replicator.sampling.state import open_store
from replicator.sampling.state.kv import KVStore
from replicator.sampling.state.records import Sender
from replicator.transport.jetstream import PublishError
from replicator.transport.kv import unreachable
from tests.sampling.helpers import FakeClock, body, eventually, make_profile, value, worker_metrics

OUTAGE_LOG = "KV state store unavailable"


def always_copy(_sender: Sender | None) -> bool:
    return True


async def kv_store(nc: Client, clock: FakeClock) -> tuple[KVStore, Limiter]:
    profile = make_profile(limiter_state="kv", age=60, advisory={"target": "sr.adv", "age": 30})
    metrics = worker_metrics()
    store = await open_store(profile, nc.jetstream(), metrics, clock=clock)
    assert isinstance(store, KVStore) and not store.degraded
    return store, Limiter(profile.settings, store, metrics, clock=clock)


def assert_no_outage(store: KVStore, caplog: pytest.LogCaptureFixture) -> None:
    assert not store.degraded
    assert value(store.metrics.limiter_state_errors) == 0
    assert OUTAGE_LOG not in caplog.text


async def test_a_stopped_server_degrades_the_store_counted_and_logged_once(
        source_server: LocalNatsServer, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    nc = await nats.connect(source_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    store, limiter = await kv_store(nc, clock)
    try:
        assert await limiter.should_copy("acme.cmdb", None, body("known"))
        source_server.stop()
        await eventually(lambda: not nc.is_connected, within=5)
        with caplog.at_level(logging.WARNING, logger=kv_module.__name__):
            assert await store.observe("new-1", clock.now, 10, always_copy, 7) is not None  # copied, not raised
            assert store.degraded
            assert await limiter.should_copy("acme.cmdb", None, body("new-2"))  # fail open: copied
            assert not await store.annotate("known", adv=clock.now)  # the advisor's marks wait
            known = await store.refresh("known")  # from the cache
            assert known is not None and known.copied == clock.now
        assert value(store.metrics.limiter_state_errors) >= 2
        outage_lines = [r for r in caplog.records if r.getMessage().startswith(OUTAGE_LOG)]
        assert len(outage_lines) == 1 and "ConnectionClosedError" in outage_lines[0].getMessage()
        source_server.start()
        await eventually(lambda: not store.degraded, within=15)
    finally:
        await store.close()
        await nc.close()


async def test_a_claim_given_a_wrong_type_raises_instead_of_degrading(
        source_nc: Client, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """A bug in what the store is asked to write (a time that is not a number) fails loudly."""
    store, _limiter = await kv_store(source_nc, clock)
    try:
        with caplog.at_level(logging.WARNING):
            with pytest.raises(TypeError):
                await store.observe("n0", "now", 10, always_copy, 7)  # type: ignore[arg-type]
            assert await store.annotate("absent", adv=clock.now) is False
            assert await store.observe("n1", clock.now, 10, always_copy, 8) is not None
            with pytest.raises(TypeError):
                await store.annotate("n1", adv="soon")  # type: ignore[arg-type]
        assert_no_outage(store, caplog)
        assert await store.annotate("n1", adv=clock.now)  # the store still works
    finally:
        await store.close()


async def test_a_decoder_bug_propagates_and_is_not_an_outage(
        source_nc: Client, clock: FakeClock, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, limiter = await kv_store(source_nc, clock)
    try:
        assert await limiter.should_copy("acme.cmdb", None, body("n1"))

        def broken(_data: bytes | None) -> Sender:
            raise TypeError("a bug in the decoder")

        monkeypatch.setattr(kv_module, "decode_sender", broken)
        with caplog.at_level(logging.WARNING):
            with pytest.raises(TypeError, match="a bug in the decoder"):
                await store.refresh("n1")
        assert_no_outage(store, caplog)
    finally:
        await store.close()


def test_what_counts_as_unreachable() -> None:
    for err in (nats.errors.TimeoutError(), nats.errors.NoRespondersError(), nats.errors.ConnectionClosedError(),
                nats.errors.OutboundBufferLimitError(), nats.errors.UnexpectedEOF(), TimeoutError(),
                ConnectionRefusedError(), PublishError("no stream captures the subject", status=503),
                nats.js.errors.ServiceUnavailableError(code=503, err_code=10008),
                nats.js.errors.NotFoundError(code=404, err_code=10059)):
        assert unreachable(err), err
    for err in (TypeError(), KeyError("x"), AssertionError(), ValueError(), nats.errors.BadSubjectError(),
                nats.js.errors.BadRequestError(code=400, err_code=10003), PublishError("bad request", 10003, 400)):
        assert not unreachable(err), err
