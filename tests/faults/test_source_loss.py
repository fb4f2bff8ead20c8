"""Loss at the source, accounted: a limits-retention source discards a range while the target is away.

The replicator runs as a process behind proxies (`rig.py`); the target's link is cut while the city
keeps publishing into a stream capped by `max_msgs`, so the stream discards what the replicator never
copied. The test then reads what the consumer of each output sees: the target stream (which source
sequences never arrived), the worker's log, its `/metrics`, `stream-replicator report`, and the `gap`
advisory on the target. The count must be exact: the sequences missing on the target, no more, no less.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from nats.js.api import StreamConfig

from replicator.copier.loss import Note
from tests.copier.helpers import make_target
from tests.faults.rig import STREAM, Rig
from tests.support.faults import log_text, metric, read_stream, scrape, stream_count, wait_count, wait_log

pytestmark = pytest.mark.slow

CAP = 2000  # the source stream's max_msgs
BEFORE, DURING = 1000, 6000  # published before the cut (copied), and while the target is away
ADVISORIES = "ADV"

MODES: dict[str, dict[str, Any]] = {
    "ordered": {},
    "ordered-sampling": {"inspect_subject_token": 2, "age": "1h",
                         "advisory": {"target": "adv.%s", "age": "30m", "reliable": True}},
    "scaled": {"workers": 2, "queued": True},
}


async def publish(rig: Rig, count: int, start: int) -> None:
    """`count` messages, each from its own sender (`fleet.s<i>`): with sampling on every one is copied,
    so what the target lacks is exactly what the source lost."""
    js = rig.source_nc.jetstream()
    for base in range(start, start + count, 1000):
        futures = [await js.publish_async(f"fleet.s{i}", f"{i:08d}".encode())
                   for i in range(base, min(base + 1000, start + count))]
        await asyncio.gather(*futures)


LOGGED = re.compile(r"no longer holds sequences (\d+)\.\.(\d+), never copied")


def sequences(ranges: list[tuple[int, int]]) -> list[int]:
    return sorted(s for a, b in ranges for s in range(a, b + 1))


def missing_ranges(seqs: set[int], upto: int) -> list[tuple[int, int]]:
    """The runs of 1..upto not in `seqs`."""
    out: list[tuple[int, int]] = []
    for s in range(1, upto + 1):
        if s in seqs:
            continue
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def report(rig: Rig) -> str:
    done = subprocess.run([sys.executable, "-m", "replicator", "report", "--config", str(rig.config_path)],
                          capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", list(MODES))
async def test_limits_discard_during_a_target_outage_is_counted_exactly(rig: Rig, mode: str) -> None:
    await rig.stream(max_msgs=CAP)
    await make_target(rig.target_nc, "batch")  # without the city's max_msgs
    if "advisory" in MODES[mode]:
        await rig.target_nc.jetstream().add_stream(StreamConfig(name=ADVISORIES, subjects=["adv.>"]))
    rig.write_config(max_in_flight=50, **MODES[mode])
    rig.spawn()
    await publish(rig, BEFORE, 0)
    assert await wait_count(rig.target_nc, STREAM, BEFORE, 60) is not None

    rig.target_proxy.cut()
    await publish(rig, DURING, BEFORE)
    await asyncio.sleep(1.0)
    rig.target_proxy.restore()
    total = BEFORE + DURING
    assert await stream_count(rig.source_nc, STREAM) == CAP

    # Everything the stream still holds arrives; what it discarded first never does.
    copied = await read_until_settled(rig, total)
    lost = missing_ranges({m.source_seq for m in copied}, total)
    assert lost, "the stream discarded nothing the replicator had not copied: the outage was too short"
    count = sum(b - a + 1 for a, b in lost)
    assert len(copied) + count == total  # exactly once for the rest

    def lost_by_reason() -> dict[str, float]:
        text = scrape(rig.monitor)
        return {r: metric(text, "stream_replicator_source_lost_msgs_total", reason=r) or 0
                for r in ("limits", "purge", "delete")}

    # Scaled mode judges a jump in its consumer order only once a hole has waited HOLE_WAIT (5 s) for
    # another pod's delivery: the count may trail the copies by that long, never exceed them.
    for _ in range(40):
        by_reason = lost_by_reason()
        if sum(by_reason.values()) >= count:
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)
    by_reason = lost_by_reason()
    assert sum(by_reason.values()) == count, (by_reason, lost)
    assert by_reason["limits"] == count
    logged = [(int(a), int(b)) for a, b in LOGGED.findall(log_text(rig.log))]
    assert sequences(logged) == sequences(lost) and len(set(logged)) == len(logged)  # each range once
    out = report(rig)
    assert f"{count:,} (limits)" in out and f"last {logged[-1][0]}..{logged[-1][1]}" in out, out
    note = await loss_note(rig)
    assert note is not None and note.lost == count and note.by == {"limits": count}

    if "advisory" in MODES[mode]:
        gaps = await gap_advisories(rig, len(logged))
        assert sorted((g["first_seq"], g["last_seq"]) for g in gaps) == sorted(logged)
        assert sum(g["count"] for g in gaps) == count
        for g in gaps:
            assert g["reasons"] == {"limits": g["count"]} and g["from"] and g["until"] and g["from"] <= g["until"]
    print(f"\n{mode}: {count} lost of {total} ({lost}); metric {by_reason}")


async def read_until_settled(rig: Rig, total: int) -> list[Any]:
    """The target's messages once its count stopped growing (the copier caught up)."""
    last = -1
    for _ in range(120):
        n = await stream_count(rig.target_nc, STREAM)
        if n == last and n > BEFORE:
            break
        last = n
        await asyncio.sleep(1.0)
    await asyncio.sleep(1.0)
    return await read_stream(rig.target_nc, STREAM)


async def loss_note(rig: Rig) -> Note | None:
    js = rig.source_nc.jetstream()
    for name in (await js.consumers_info(STREAM)):
        note = Note.parse((name.config.metadata or {}).get("stream-replicator.loss"))
        if note is not None:
            return note
    return None


async def gap_advisories(rig: Rig, want: int) -> list[dict[str, Any]]:
    for _ in range(50):
        msgs = await read_stream(rig.target_nc, ADVISORIES)
        gaps = [json.loads(m.data) for m in msgs if m.subject == "adv.gap"]
        if len(gaps) >= want:
            return gaps
        await asyncio.sleep(0.2)
    return gaps


@pytest.mark.timeout(180)
async def test_a_purge_while_the_target_is_away_is_counted_as_a_purge(rig: Rig) -> None:
    await rig.stream()
    await make_target(rig.target_nc, "batch")
    rig.write_config(max_in_flight=50)
    rig.spawn()
    await publish(rig, BEFORE, 0)
    assert await wait_count(rig.target_nc, STREAM, BEFORE, 60) is not None
    rig.target_proxy.cut()
    await publish(rig, 3000, BEFORE)
    await rig.source_nc.jetstream().purge_stream(STREAM)
    await publish(rig, 500, 4000)
    await asyncio.sleep(1.0)
    rig.target_proxy.restore()
    copied = await read_until_settled(rig, 4500)
    lost = missing_ranges({m.source_seq for m in copied}, 4500)
    count = sum(b - a + 1 for a, b in lost)
    assert count and len(copied) + count == 4500
    assert await wait_log(rig.log, "never copied", 10) is not None
    assert sequences([(int(a), int(b)) for a, b in LOGGED.findall(log_text(rig.log))]) == sequences(lost)
    text = scrape(rig.monitor)
    assert metric(text, "stream_replicator_source_lost_msgs_total", reason="purge") == count
    assert (metric(text, "stream_replicator_source_lost_msgs_total", reason="limits") or 0) == 0
