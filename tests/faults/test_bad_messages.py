"""Bad and odd messages: copied byte-exact with their headers, or (over the target's limit) skipped
as poison without stalling the messages behind them.

The target server runs with a `max_payload` smaller than the source's, the realistic way a
message can be acceptable on one side and not the other.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from prometheus_client import generate_latest

from replicator.demo.local_nats import LocalNatsServer
from replicator.service.runner import Replicator
from replicator.transport.jetstream import Publisher, PublishError
from tests.copier.helpers import InProcess, make_stream, profile_for, publish_many, topic_config
from tests.support.faults import compare, metric, read_stream, wait_count

TARGET_MAX_PAYLOAD = 64 * 1024
SCALED: dict[str, Any] = {"workers": 2, "queue_group": "fleet_grp", "name": None}
MODES: dict[str, dict[str, Any]] = {
    "ordered": {},
    "ordered-sampled": {"inspect": "host", "age": "1h"},
    "scaled": SCALED,
}


@pytest.fixture
def small_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    server = LocalNatsServer(name="small-target", store_dir=tmp_path_factory.mktemp("small-target"),
                             max_payload=TARGET_MAX_PAYLOAD)
    server.start()
    yield server
    server.close()


@pytest.fixture
async def small_target_nc(small_target: LocalNatsServer) -> Any:
    nc = await nats.connect(small_target.url)
    yield nc
    await nc.close()


def odd_messages() -> list[tuple[str, bytes, dict[str, str] | None]]:
    """(subject, payload, headers): everything a fleet of old and new agents might send."""
    deep = b'{"host": "deep", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # past any recursion limit
    return [
        ("fleet.json.bad", b'{"host": "trunc", "v": [1, 2', None),
        ("fleet.json.bad", b"{'host': 'single-quotes'}", None),
        ("fleet.json.deep", deep, None),
        ("fleet.json.null", b"null", None),
        ("fleet.json.ok", json.dumps({"host": "unique-1", "v": "ok"}).encode(), None),
        ("fleet.empty", b"", None),
        ("fleet.bin", bytes(range(256)) * 16, None),
        ("fleet.bin", b"\x00" * 1000 + b"\xff\xfe\xfd", None),
        ("fleet.bin", b"PUB fleet.x 5\r\nhello\r\nHPUB a b 1 2\r\n\r\n", None),
        ("fleet.bin", bytes((i * 37 + 11) % 256 for i in range(60_000)), None),
        ("fleet.hdr", b"unicode", {"X-Unicode": "häßlich ✓ 日本語 🚀", "X-Emoji-Only": "🛰️"}),
        ("fleet.hdr", b"many", {f"X-Header-{i:03d}": f"value {i}" for i in range(120)}),
        ("fleet.hdr", b"long", {"X-Long": "v" * 16_000}),
        ("fleet.hdr", b"case", {"x-lower-case": "a", "X-MiXeD-CaSe": "b", "ALLCAPS": "c",
                                "Host": "header-host"}),
        ("fleet.hdr", b"colons", {"X-Colons": "a:b:c: d", "X-Url": "nats://u@h:4222/?q=1", "X-Empty": ""}),
        ("fleet.hdr", b"own-id", {"Nats-Msg-Id": "agent-42-update-7", "X-Other": "kept"}),
        ("fleet.\u00e9t\u00e9.subject", b"unicode subject token", {"X-Unicode-Subject": "yes"}),
    ]


async def publish_odd(nc: Client) -> int:
    js = nc.jetstream()
    await publish_many(nc, 20)
    odd = odd_messages()
    for subject, payload, headers in odd:
        await js.publish(subject, payload, headers=headers)
    await publish_many(nc, 20, start=20)
    return 40 + len(odd)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", list(MODES))
async def test_odd_payloads_and_headers_are_copied_byte_exact(
    mode: str, source_server: LocalNatsServer, source_nc: Client, small_target: LocalNatsServer,
    small_target_nc: Client,
) -> None:
    """Invalid and deeply nested JSON, binary and protocol-looking payloads, unicode, many, long
    and odd-case headers: payload and headers arrive unchanged (and a message's own Nats-Msg-Id
    is kept). With sampling on, messages without a usable key are copied, not dropped."""
    await make_stream(source_nc)
    total = await publish_odd(source_nc)
    profile = profile_for(topic_config(source_server.url, small_target.url, **MODES[mode]))
    async with InProcess(profile):
        assert await wait_count_or_fail(small_target_nc, total)
        await asyncio.sleep(0.5)
    source = await read_stream(source_nc, "FLEET")
    target = await read_stream(small_target_nc, "FLEET")
    outcome = compare(f"odd messages ({mode})", source, target, recover_s=None)
    assert outcome.lost == 0 and outcome.mismatched == 0, outcome
    if mode != "scaled":
        assert outcome.duplicated == 0 and outcome.out_of_order == 0, outcome


async def wait_count_or_fail(nc: Client, count: int, within: float = 40) -> bool:
    got = await wait_count(nc, "FLEET", count, within)
    assert got is not None, f"target never reached {count} messages"
    return True


def _failed(replicator: Replicator) -> float:
    text = generate_latest(replicator.metrics.registry).decode()
    name = "stream_replicator_failed_msgs_total"
    return sum(metric(text, name, worker=w.name) or 0 for w in replicator.workers)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_messages_over_the_target_max_payload_are_skipped_without_stalling(
    mode: str, source_server: LocalNatsServer, source_nc: Client, small_target: LocalNatsServer,
    small_target_nc: Client, caplog: pytest.LogCaptureFixture,
) -> None:
    """A message the target can never take (payload over its max_payload, or a payload that fits
    only without the replicator's headers) is counted in failed_msgs, logged, and given up after
    5 attempts; everything after it is copied, in order in ordered mode."""
    caplog.set_level(logging.WARNING, logger="replicator")
    js = source_nc.jetstream()
    await make_stream(source_nc)
    await publish_many(source_nc, 50)
    huge = await js.publish("fleet.huge", b"H" * (200 * 1024))
    await publish_many(source_nc, 50, start=50)
    # Fits the target's limit on its own; with the provenance and msg-id headers it does not.
    borderline = await js.publish("fleet.borderline", b"B" * (TARGET_MAX_PAYLOAD - 40))
    await publish_many(source_nc, 50, start=100)
    poison = {huge.seq, borderline.seq}
    overrides = SCALED if mode == "scaled" else {}
    profile = profile_for(topic_config(source_server.url, small_target.url, **overrides))
    started = time.monotonic()
    async with InProcess(profile) as replicator:
        assert await wait_count_or_fail(small_target_nc, 150, within=60)
        took = time.monotonic() - started
        for _ in range(100):  # the counter lags the skip by at most one pass of the loop
            if _failed(replicator) >= 8:
                break
            await asyncio.sleep(0.2)
        failed = _failed(replicator)
        if mode == "scaled":  # both given up (terminated): nothing left for the group to deliver
            await _wait_group_clean(source_nc)
    source = [m for m in await read_stream(source_nc, "FLEET") if m.seq not in poison]
    target = await read_stream(small_target_nc, "FLEET")
    outcome = compare(f"max payload ({mode})", source, target, recover_s=took)
    assert outcome.lost == 0 and outcome.mismatched == 0 and len(target) == 150, outcome
    if mode == "ordered":
        assert outcome.duplicated == 0 and outcome.out_of_order == 0, outcome
    assert failed >= 8, f"failed_msgs {failed}: each poison message is counted per attempt"
    gave_up = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert len(gave_up) == 2 and all("maximum payload" in g for g in gave_up), gave_up
    gc.collect()  # dropped futures report unread errors when collected
    unread = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not unread, f"{len(unread)} x {unread[:1]}: failed publishes logged as unhandled errors"
    assert took < 40, f"{took:.1f}s to get past two poison messages"


async def _wait_group_clean(nc: Client, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        info = await nc.jetstream().consumer_info("FLEET", "fleet_grp")
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"the group still holds messages: {info}")


@pytest.mark.timeout(30)
async def test_publisher_checks_headers_plus_payload_against_max_payload(
    small_target: LocalNatsServer, small_target_nc: Client
) -> None:
    """At the exact limit the target takes the message; one byte over, the publisher refuses it
    locally and the connection survives (the server would have closed it for good)."""
    await make_stream(small_target_nc)
    headers = {"Nats-Msg-Id": "edge-1", "X-Pad": "p"}
    hlen = len(("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode())
    publisher = Publisher(small_target_nc)
    await publisher.start()
    try:
        fut = await publisher.publish("fleet.edge", b"e" * (TARGET_MAX_PAYLOAD - hlen), headers)
        await asyncio.wait_for(fut, 5)
        over = await publisher.publish("fleet.edge", b"e" * (TARGET_MAX_PAYLOAD - hlen + 1),
                                       {**headers, "Nats-Msg-Id": "edge-2"})
        with pytest.raises(PublishError, match="maximum payload"):
            await asyncio.wait_for(over, 5)
        await small_target_nc.flush(timeout=2)
        assert small_target_nc.is_connected
    finally:
        await publisher.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_publish_conditions_are_not_reapplied_on_the_target(
    mode: str, source_server: LocalNatsServer, source_nc: Client, small_target: LocalNatsServer,
    small_target_nc: Client,
) -> None:
    """`Nats-Expected-*` headers were the publisher's conditions on the source stream (checked when
    it stored the message). Re-checked on a target stream with another name and other sequences
    they fail forever: the copy drops them, and nothing stalls behind such a message."""
    js = source_nc.jetstream()
    await make_stream(source_nc)
    await publish_many(source_nc, 10)
    await js.publish("fleet.cas", b"create", headers={"Nats-Expected-Stream": "FLEET",
                                                      "Nats-Expected-Last-Subject-Sequence": "0"})
    await js.publish("fleet.cas", b"update", headers={"Nats-Expected-Last-Subject-Sequence": "11",
                                                      "X-Kept": "yes"})
    await publish_many(source_nc, 10, start=12)
    overrides = {"target_stream": "FLEET_COPY", **(SCALED if mode == "scaled" else {})}
    async with InProcess(profile_for(topic_config(source_server.url, small_target.url, **overrides))):
        took = await wait_count(small_target_nc, "FLEET_COPY", 22, 20)
    got = (await small_target_nc.jetstream().stream_info("FLEET_COPY")).state.messages
    assert took is not None and got == 22, f"{got} of 22 copied: a publish condition was re-applied"
    copies = [m for m in await read_stream(small_target_nc, "FLEET_COPY") if m.subject == "fleet.cas"]
    assert [m.data for m in sorted(copies, key=lambda m: m.source_seq)] == [b"create", b"update"]
    assert copies[-1].headers.get("X-Kept") == "yes" or copies[0].headers.get("X-Kept") == "yes"
    for m in copies:
        assert not [k for k in m.headers if k.startswith("Nats-Expected-Stream")]
        assert not [k for k in m.headers if k.startswith("Nats-Expected-Last-Subject")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_repeated_header_names_and_padded_values_survive(
    mode: str, source_server: LocalNatsServer, source_nc: Client, small_target: LocalNatsServer,
    small_target_nc: Client,
) -> None:
    """The header block is copied as bytes: a name repeated in one message keeps every value, in
    order, and the spaces around a value stay; only the lines the header policy acts on change
    (here a server-interpreted header, renamed), and this hop's own lines are added."""
    await make_stream(source_nc)
    raw = (b"NATS/1.0\r\nX-Multi: one\r\nX-Multi: two\r\nX-Padded:   spaced  \r\nNats-Msg-Id: m-1\r\n"
           b"X-Multi: three\r\n\r\n")
    inbox = source_nc.new_inbox()
    sub = await source_nc.subscribe(inbox)
    await source_nc._send_command(b"HPUB fleet.multi %s %d %d\r\n%s%s\r\n" % (
        inbox.encode(), len(raw), len(raw) + 2, raw, b"mv"))
    await source_nc.flush()
    with contextlib.suppress(Exception):
        await sub.next_msg(timeout=2)
    overrides = SCALED if mode == "scaled" else {}
    async with InProcess(profile_for(topic_config(source_server.url, small_target.url, **overrides))):
        assert await wait_count(small_target_nc, "FLEET", 1, 15) is not None
    original = _raw_headers(await source_nc.jetstream().get_msg("FLEET", 1))
    copied = _raw_headers(await small_target_nc.jetstream().get_msg("FLEET", 1))
    assert b"X-Multi: one\r\nX-Multi: two\r\n" in original, original  # the source kept both
    assert copied.startswith(b"NATS/1.0\r\nX-Multi: one\r\nX-Multi: two\r\nX-Padded:   spaced  \r\n"
                             b"Stream-Replicator-Orig-Nats-Msg-Id: m-1\r\nX-Multi: three\r\n"), copied
    assert b"\r\nStream-Replicator-Source: FLEET 1 " in copied and b"\r\nNats-Msg-Id: " in copied, copied


def _raw_headers(msg: Any) -> bytes:
    """The stored header block of a message from the get API (base64 in the API's JSON)."""
    return base64.b64decode(msg.hdrs) if msg.hdrs else b""
