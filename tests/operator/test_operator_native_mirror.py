"""The native engine's mirror form against real servers (the leaf and hub of test_operator_native.py,
JetStream domains joined by a leafnode), the real operator over the API emulator.

A resource that creates its target stream gets a mirror: the target keeps the source's sequence
numbers. Handing over to the replicator promotes the mirror (NATS 2.12+): it keeps its messages and
their sequences, and the replicator goes on right after the last one, nothing lost or repeated.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from nats.aio.client import Client
from replication_operator.engine import mirror
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator.helpers import Api
from tests.operator.pods import Kubelet
from tests.operator.test_operator_native import (  # noqa: F401  (fixtures)
    NS,
    Publisher,
    api_call,
    condition,
    publish,
    publishing,
    resource,
    site_ncs,
    sites,
    status,
    stream_config,
)
from tests.support.kube_emulator import ClusterEmulator, wait_for

Message = tuple[int, str, bytes, dict[str, str]]  # (stream sequence, subject, data, headers)


async def stored(nc: Client, stream: str, first: int = 1) -> list[Message]:
    """Every message of the stream by sequence (direct gets in batches: mirrors have gaps)."""
    last = int((await api_call(nc, f"STREAM.INFO.{stream}"))["state"]["last_seq"])
    found: list[Message] = []
    for seq in range(first, last + 1):
        msg = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode(), timeout=5)
        data = json.loads(msg.data)
        if "message" not in data:
            continue
        raw = data["message"]
        headers: dict[str, str] = {}
        if raw.get("hdrs"):
            for line in base64.b64decode(raw["hdrs"]).decode().split("\r\n")[1:]:
                if ":" in line:
                    key, _, value = line.partition(":")
                    headers[key.strip()] = value.strip()
        found.append((seq, raw["subject"], base64.b64decode(raw.get("data") or ""), headers))
    return found


def source_sequence(message: Message) -> int:
    """The source sequence a copy stands for: the mirror's own sequence, or the replicator's header."""
    seq, _, _, headers = message
    header = headers.get("Stream-Replicator-Source") or headers.get("Nats-Stream-Source")
    return int(header.split(" ")[1]) if header else seq


async def test_a_created_target_is_a_mirror_keeping_the_source_sequences(
    api: Api, operator: Reconciler, sites: tuple[LocalNatsServer, LocalNatsServer],  # noqa: F811
    site_ncs: tuple[Client, Client],  # noqa: F811
) -> None:
    leaf, hub = sites
    leaf_nc, hub_nc = site_ncs
    await leaf_nc.jetstream().add_stream(name="MIR", subjects=["mir.>", "other.>"])
    await publish(leaf_nc, "mir", 6000)
    await publish(leaf_nc, "other", 100)  # not the topic: the mirror leaves their sequences empty
    await publish(leaf_nc, "mir", 6000, start=6000)
    name = "mirrored"
    body = resource(name, leaf, hub, target={"stream": "MIR_HUB"})
    body["spec"].update(topic="mir.>")
    body["spec"]["source"]["stream"] = "MIR"
    await api.create(body)
    await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=30)
    recorded = status(api, name)["native"]
    assert (recorded["form"], recorded["formReason"]) == (mirror.MIRROR, mirror.CREATED_ALONE)
    assert "stream MIR_HUB mirrors MIR" in condition(api, name, "Ready")["message"]
    config = await stream_config(hub_nc, "MIR_HUB")
    assert config["mirror"]["name"] == "MIR" and not config.get("subjects") and not config.get("sources")

    async def copied() -> bool:
        state = (await api_call(hub_nc, "STREAM.INFO.MIR_HUB"))["state"]
        return bool(state["messages"] == 12_000 and state["last_seq"] == 12_100)

    await wait_for(copied, within=60, interval=0.5)
    source = {seq: (subject, data) for seq, subject, data, _ in await stored(leaf_nc, "MIR")}
    target = await stored(hub_nc, "MIR_HUB")
    assert len(target) == 12_000
    for seq, subject, data, _ in target:
        assert (subject, data) == (f"hub.{source[seq][0]}", source[seq][1]), seq
    assert {s for s, (subj, _) in source.items() if subj.startswith("mir.")} == {m[0] for m in target}
    print(f"\nmirror form: {len(target)} messages, target sequence = source sequence for each")
    await wait_for(lambda: status(api, name).get("lag") == 0)

    # Deleted: the mirror is promoted (it stops copying), the stream and its messages stay.
    await api.delete(naming.STREAM_REPLICATION, NS, name)
    await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, name) is None, within=15)
    config = await stream_config(hub_nc, "MIR_HUB")
    assert "mirror" not in config and config["subjects"] == ["hub.mir.>"]
    assert (await api_call(hub_nc, "STREAM.INFO.MIR_HUB"))["state"]["messages"] == 12_000


@pytest.mark.slow
async def test_promotion_to_the_replicator_loses_and_repeats_nothing(
    api: Api, cluster: ClusterEmulator, operator: Reconciler,
    sites: tuple[LocalNatsServer, LocalNatsServer], site_ncs: tuple[Client, Client],  # noqa: F811
    tmp_path: Path,
) -> None:
    """mirror -> replicator while the source is written without pause: the promoted stream keeps the
    mirror's sequences, and every source message lands exactly once, in order."""
    leaf, hub = sites
    leaf_nc, hub_nc = site_ncs
    cluster.hold_foreground = True
    name = "promoted"
    body = resource(name, leaf, hub, engine="native", target={"stream": "PROMO_HUB"})
    publisher = await publishing(leaf_nc, body, "PROMO", "promo")

    async def landed() -> list[Message]:
        try:
            return await stored(hub_nc, "PROMO_HUB")
        except AssertionError:  # not created yet
            return []

    async def grows(by: int) -> None:
        before = int((await api_call(hub_nc, "STREAM.INFO.PROMO_HUB"))["state"]["last_seq"])

        async def more() -> bool:
            return int((await api_call(hub_nc, "STREAM.INFO.PROMO_HUB"))["state"]["last_seq"]) >= before + by

        await wait_for(more, within=30, interval=0.3)

    async with Kubelet(api, NS, name, tmp_path) as kubelet:
        await api.create(body)
        await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=30)
        assert status(api, name)["native"]["form"] == mirror.MIRROR
        await grows(500)  # NATS mirrors

        await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"engine": "replicator"}})
        await wait_for(lambda: kubelet.starts == 1, within=30)
        after = status(api, name)
        assert after["engine"] == "replicator" and after.get("resumeAfter")
        config = await stream_config(hub_nc, "PROMO_HUB")
        assert "mirror" not in config and config["subjects"] == ["hub.promo.>"]
        await grows(500)  # the replicator's pod copies into the promoted stream

        published = await publisher.stop()

        async def complete() -> bool:
            return len(await landed()) >= published

        await wait_for(complete, within=60, interval=0.5)
        messages = await landed()
    seqs = [source_sequence(m) for m in messages]
    lost = sorted(set(range(1, published + 1)) - set(seqs))
    duplicated = len(seqs) - len(set(seqs))
    mirrored = [m for m in messages if "Stream-Replicator-Source" not in m[3]]
    print(f"\npromotion under load: {published} published, {len(seqs)} landed, {len(mirrored)} by the mirror, "
          f"handover after {after['resumeAfter']}, lost {len(lost)}, duplicated {duplicated}")
    assert (lost, duplicated) == ([], 0)
    assert seqs == list(range(1, published + 1)), "in order"
    assert [m[0] for m in mirrored] == list(range(1, after["resumeAfter"] + 1)), "the mirror's sequences kept"
    assert "Promoted" in api.reasons(NS, name)


async def publish_tagged(nc: Client, subject: str, tag: str, count: int) -> None:
    js = nc.jetstream()
    futures = [await js.publish_async(f"{subject}.n{i % 20}", f"{tag}{i}".encode()) for i in range(count)]
    for future in futures:
        await future


@pytest.mark.parametrize("form", ["source", "mirror"])
async def test_a_recreated_source_stream_is_repaired_without_loss_or_duplicates(
    api: Api, operator: Reconciler, sites: tuple[LocalNatsServer, LocalNatsServer],  # noqa: F811
    site_ncs: tuple[Client, Client], form: str,  # noqa: F811
) -> None:
    """NATS alone reports lag 0 and copies nothing from a source stream deleted and created again
    (it waits for the old stream's next sequence); the operator sees the new stream (its creation
    time) and starts the entry again at its first sequence: every message of both streams lands
    once. A mirror cannot take the new stream's sequences: it is promoted and a source entry goes on."""
    leaf, hub = sites
    leaf_nc, hub_nc = site_ncs
    js = leaf_nc.jetstream()
    upper = form.upper()
    await js.add_stream(name=f"REC_{upper}", subjects=[f"rec{form}.>"])
    await publish_tagged(leaf_nc, f"rec{form}", "old", 1000)
    name = f"recreated-{form}"
    body = resource(name, leaf, hub, target={"stream": f"REC_{upper}_HUB"}, native={"form": form})
    body["spec"].update(topic=f"rec{form}.>")
    body["spec"]["source"]["stream"] = f"REC_{upper}"
    await api.create(body)
    await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=30)
    assert status(api, name)["native"]["form"] == form

    async def bodies() -> list[bytes]:
        return [data for _, subject, data, _ in await stored(hub_nc, f"REC_{upper}_HUB")
                if subject.startswith(f"hub.rec{form}.")]

    async def count(n: int) -> bool:
        return len(await bodies()) >= n

    await wait_for(lambda: count(1000), within=30, interval=0.3)
    await wait_for(lambda: status(api, name)["native"].get("sourceCreated"), within=10)

    await js.delete_stream(f"REC_{upper}")
    await js.add_stream(name=f"REC_{upper}", subjects=[f"rec{form}.>"])
    await publish_tagged(leaf_nc, f"rec{form}", "new", 600)
    await wait_for(lambda: condition(api, name, "SourceRecreated").get("reason") == "Repaired", within=30)
    await publish_tagged(leaf_nc, f"rec{form}", "more", 400)
    await wait_for(lambda: count(2000), within=30, interval=0.3)
    await wait_for(lambda: status(api, name).get("lag") == 0, within=15)
    landed = await bodies()
    expected = {f"old{i}".encode() for i in range(1000)} | {f"new{i}".encode() for i in range(600)} | {
        f"more{i}".encode() for i in range(400)}
    duplicated = len(landed) - len(set(landed))
    lost = expected - set(landed)
    native_status = status(api, name)["native"]
    print(f"\nrecreated source ({form}): {len(landed)} landed of {len(expected)}, lost {len(lost)}, "
          f"duplicated {duplicated}; {native_status['lastRecreation']}")
    assert (len(lost), duplicated) == (0, 0)
    assert native_status["recreations"] == 1 and native_status["form"] == "source"
    assert "SourceRecreated" in api.reasons(NS, name)
    sample = operator.metrics.registry.get_sample_value(
        "stream_replicator_native_source_recreations",
        {"namespace": NS, "name": naming.default_replicator_name(NS, name), "worker": "native"})
    assert sample == 1
    assert condition(api, name, "Ready")["reason"] == "Sourcing"


async def test_a_second_source_promotes_the_mirror_losing_and_repeating_nothing(
    api: Api, operator: Reconciler, sites: tuple[LocalNatsServer, LocalNatsServer],  # noqa: F811
    site_ncs: tuple[Client, Client],  # noqa: F811
) -> None:
    """A second resource into the stream the first created as a mirror: the mirror is promoted, the
    first goes on as a source entry right after the mirror's last copy, while its source is written
    without pause; the second's messages land beside."""
    leaf, hub = sites
    leaf_nc, hub_nc = site_ncs
    js = leaf_nc.jetstream()
    await js.add_stream(name="FIRST", subjects=["first.>"])
    await js.add_stream(name="SECOND", subjects=["second.>"])
    await publish(leaf_nc, "second", 300)
    publisher = Publisher(leaf_nc, "first")
    publisher.start()
    first = resource("first", leaf, hub, target={"stream": "SHARED_HUB"})
    first["spec"].update(topic="first.>")
    first["spec"]["source"]["stream"] = "FIRST"
    await api.create(first)
    await wait_for(lambda: status(api, "first").get("native", {}).get("form") == mirror.MIRROR, within=30)

    async def ours(prefix: str) -> list[Message]:
        return [m for m in await stored(hub_nc, "SHARED_HUB") if m[1].startswith(prefix)]

    async def at_least(prefix: str, n: int) -> bool:
        info = await api_call(hub_nc, "STREAM.INFO.SHARED_HUB", {"subjects_filter": f"{prefix}>"})
        return sum((info["state"].get("subjects") or {}).values()) >= n

    await wait_for(lambda: at_least("hub.first.", 300), within=30, interval=0.3)
    second = resource("second", leaf, hub, target={"stream": "SHARED_HUB", "subjectPrefix": "hub2"})
    second["spec"].update(topic="second.>")
    second["spec"]["source"]["stream"] = "SECOND"
    await api.create(second)
    await wait_for(lambda: "Promoted" in api.reasons(NS, "second"), within=30)
    await wait_for(lambda: status(api, "first")["native"].get("form") == mirror.SOURCE, within=30)
    assert status(api, "first")["native"]["formReason"].startswith(mirror.PROMOTED)
    await wait_for(lambda: at_least("hub2.second.", 300), within=30, interval=0.3)
    await wait_for(lambda: condition(api, "first", "Ready").get("reason") == "Sourcing", within=30)
    before = publisher.count
    await wait_for(lambda: at_least("hub.first.", before + 300), within=30, interval=0.3)
    published = await publisher.stop()
    await wait_for(lambda: at_least("hub.first.", published), within=60, interval=0.5)
    seqs = [source_sequence(m) for m in await ours("hub.first.")]
    lost = sorted(set(range(1, published + 1)) - set(seqs))
    duplicated = len(seqs) - len(set(seqs))
    print(f"\nsecond source: {published} published to the first, {len(seqs)} landed, lost {len(lost)}, "
          f"duplicated {duplicated}; the second's {len(await ours('hub2.second.'))} of 300 beside")
    assert (lost, duplicated) == ([], 0)
    assert seqs == list(range(1, published + 1))
    assert "mirror" not in await stream_config(hub_nc, "SHARED_HUB")
