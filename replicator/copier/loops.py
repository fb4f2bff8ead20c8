"""The loop guard: a copy is never copied again, not by the writer that made it and not back to the
place it came from.

A loop turns the replicator into an amplifier: a city that is a leafnode of its region (same
account, JetStream domains) whose stream captures the subjects the region's copies are published
on gets every copy back, and the replicator copies it again, for ever. Two checks:

- At start (`check_start`): the subjects the copies are published on overlap the source stream's
  subjects, and a message published on the target connection reaches the source connection (one
  NATS system, one account). Then every copy would be stored in the source stream as well: refused,
  whatever the mode, since skipping cannot undo a copy the source stream has already stored.
- At run time (`LoopGuard`): a delivered message whose provenance header names this writer, or
  names the target stream instance as the place it came from. Refused by default (exit status 2);
  with `active_active: true` (two sites replicating into each other) skipped, counted and noted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from typing import TYPE_CHECKING, Final

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from replicator.config.errors import ConfigError
from replicator.config.model import Profile
from replicator.copier.provenance import PROVENANCE, Provenance, parse_provenance, stream_identity
from replicator.transport.streams import set_consumer_note, stream_created
from replicator.transport.subjects import SubjectRewriter

if TYPE_CHECKING:
    from replicator.copier.endpoints import Endpoints
    from replicator.copier.transform import MessageTransform
    from replicator.transport.wire import RawMsg

log = logging.getLogger(__name__)

LOOP_NOTE = "stream-replicator.loops"  # consumer metadata, per worker: `<LOOP_NOTE>.<worker>`
NOTE_EVERY = 60.0  # seconds between a skipping worker's log lines and notes
PROBE_FOR = 0.3  # seconds a start-up probe asks again while the target has no responders
_LINE: Final = b"\r\n" + PROVENANCE.encode() + b":"

FIXES = ("set target_subject_prefix so that the copies land on subjects the source stream does not capture; "
         "or publish the copies in another account; or let NATS source the stream natively (the operator's "
         "engine: native)")


class CopyLoopError(ConfigError):
    """The copies would come back to the source: refused, exit status 2."""


def subjects_meet(a: str, b: str) -> bool:
    """Do two NATS subject patterns (`*`, `>`) match a subject in common?"""
    ta, tb = a.split("."), b.split(".")
    for x, y in zip(ta, tb, strict=False):
        if x == ">" or y == ">":
            return True
        if x != y and x != "*" and y != "*":
            return False
    return len(ta) == len(tb)


def overlap(copies: str, source_subjects: list[str]) -> list[str]:
    """The source stream's subjects that the copies' subject pattern meets."""
    return [s for s in source_subjects if subjects_meet(copies, s)]


async def reaches(target_nc: Client, source_nc: Client, wait: float = PROBE_FOR) -> bool:
    """Does a core request on the target connection arrive on the source connection (the same NATS
    system and account: a leafnode, a gateway, or the same servers)? On an inbox subject, which no
    stream captures. Where it does not, the target server answers "no responders" at once; asked
    again for `wait` seconds, for a leafnode's interest to spread."""
    subject = source_nc.new_inbox()
    arrived = asyncio.Event()

    async def answer(msg: Msg) -> None:
        arrived.set()
        if msg.reply:
            await source_nc.publish(msg.reply, b"")

    sub = await source_nc.subscribe(subject, cb=answer)
    try:
        await source_nc.flush()
        deadline = time.monotonic() + wait
        while not arrived.is_set():
            with contextlib.suppress(NoRespondersError, nats.errors.TimeoutError):
                await target_nc.request(subject, b"stream-replicator loop probe", timeout=0.25)
            if arrived.is_set() or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        return arrived.is_set()
    finally:
        with contextlib.suppress(Exception):  # the probe's answer stands whatever the unsubscribe does
            await sub.unsubscribe()


async def check_start(profile: Profile, source_nc: Client, target_nc: Client, source_stream: str,
                      source_subjects: list[str]) -> None:
    """Refuse (CopyLoopError) when the copies would be stored in the source stream again."""
    settings = profile.settings
    copies = SubjectRewriter(settings)(settings.topic)
    met = overlap(copies, source_subjects)
    if not met or not await reaches(target_nc, source_nc):
        return
    raise CopyLoopError(
        f"{profile.source}: {profile.key('topic')}: copy loop: the copies are published on {copies!r} at the "
        f"target, which reaches the source's NATS system (the same account through a leafnode, gateway or "
        f"server), where source stream {source_stream} captures {', '.join(repr(s) for s in met)}: every copy "
        f"would be stored in the source again and copied again. Fix: {FIXES}")


class LoopGuard:
    """The run-time check on each delivery that carries a provenance header (a copy): refused, or
    with `active_active` skipped and counted (`loop_skipped_msgs`, a log line and a consumer note
    at most every `NOTE_EVERY` seconds)."""

    def __init__(self, ep: Endpoints, transform: MessageTransform, consumer: str) -> None:
        self.ep = ep
        self.transform = transform  # its writer changes when the source stream is created again
        self.consumer = consumer
        self.skip = ep.profile.settings.active_active
        self.target_instance = ""
        self.skipped = 0
        self.noted = 0.0
        self.notes: set[asyncio.Task[None]] = set()

    async def bind(self) -> None:
        """The target stream instance: a copy that came from it never goes back."""
        self.target_instance = stream_identity(await stream_created(self.ep.target_nc, self.ep.target_stream,
                                                                    timeout=5.0))

    def looped(self, msg: RawMsg, seq: int) -> bool:
        """True: skip this delivery (a loop, active-active). Raises CopyLoopError when refusing."""
        hdr = msg.hdr
        if hdr is None or _LINE not in hdr:
            return False
        why = self.why(_provenance(hdr))
        if why is None:
            return False
        if not self.skip:
            text = (f"{self.ep.profile.source}: {self.ep.profile.key('topic')}: copy loop: source sequence {seq} of "
                    f"{self.ep.source_stream} is {why}. Set active_active: true if two sites replicate into each "
                    f"other on purpose (such copies are then skipped and counted); otherwise {FIXES}")
            log.error("%s", text)
            self._note(f"refused: source sequence {seq} is {why}")
            raise CopyLoopError(text)
        self.skipped += 1
        self.ep.metrics.loop_skipped_msgs.inc()
        now = time.monotonic()
        if now - self.noted >= NOTE_EVERY:
            self.noted = now
            log.warning("%s skipped %d copies that would loop (active-active), the latest source sequence %d: %s",
                        self.ep.worker, self.skipped, seq, why)
            self._note(f"skipped {self.skipped} (active-active; as of {dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ})")
        return True

    def why(self, prov: Provenance | None) -> str | None:
        """Why a copy with this provenance must not be copied (None: it may)."""
        if prov is None:
            return None
        writer = self.transform.writer
        if prov.writer == writer.id:
            return f"this replicator's own copy (writer {writer.id}) come back"
        if prov.instance and prov.instance == self.target_instance and prov.stream == self.ep.target_stream:
            return f"a copy from target stream {self.ep.target_stream} (instance {prov.instance}), not copied back"
        return None

    def _note(self, text: str) -> None:
        """The consumer note `report` and the operator read; written in the background (a verdict
        is synchronous)."""
        task = asyncio.ensure_future(self._write_note(text))
        self.notes.add(task)
        task.add_done_callback(self.notes.discard)

    async def _write_note(self, text: str) -> None:
        with contextlib.suppress(Exception):  # a note is information; failing to write it changes nothing
            await set_consumer_note(self.ep.source_js, self.ep.source_stream, self.consumer,
                                    f"{LOOP_NOTE}.{self.ep.worker}", text)

    async def settle(self) -> None:
        """Notes still being written are given a moment (a refusal's note before the process exits)."""
        if self.notes:
            await asyncio.wait(list(self.notes), timeout=2.0)


def loop_notes(metadata: dict[str, str]) -> str:
    """What the workers of a consumer noted about loops, one entry each."""
    return "; ".join(v for k, v in sorted(metadata.items()) if v and k.startswith(f"{LOOP_NOTE}."))


def _provenance(hdr: bytes) -> Provenance | None:
    start = hdr.find(_LINE) + len(_LINE)
    end = hdr.find(b"\r\n", start)
    return parse_provenance(hdr[start:end if end >= 0 else len(hdr)].decode("latin-1").strip())
