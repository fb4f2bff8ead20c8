"""Runs of deliveries admitted in one compiled call (`setup.py` compiles this module).

Every delivery is an ack subject to read, a sampling decision, and either a note of the newest
skipped sequence or a copy built and placed in the window. In the ordered copier's interpreted
loop that was most of its time: at fleet rates the skips (cProfile, 1.2 million fleet
deliveries: the copier's `_admit`, 5.0 of 9.0 s), and for every copy five interpreted calls
(the decision, the window entry, the copy's build and its header block) where a 512 B message's
whole copy costs a few microseconds. `take_run` takes the whole run at once: skips, and copies
built (`transform.py`, compiled too) into window entries, until the first delivery that is
neither: a decision only the state store can settle, a gap in the consumer's sequence or a
redelivery; or until the window has no more room. The copier keeps every rule about those.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Final

from replicator.copier.transform import MessageTransform
from replicator.copier.window import Entry
from replicator.sampling.limiter import DeliveryCheck, Pending, copy_everything
from replicator.transport.wire import ACK_CONSUMER_SEQ, ACK_PENDING, ACK_STREAM_SEQ, ACK_TIMESTAMP, RawMsg, ack_tokens


class Run:
    """What `take_run` did, for the copier to apply once per run."""

    def __init__(self) -> None:
        self.skipped = 0  # deliveries skipped, taken off the buffer
        self.skipped_bytes = 0
        self.entries: list[Entry] = []  # copies, built and ready for the window, in order
        self.copied_bytes = 0
        self.last_cseq = 0  # consumer sequence of the last delivery taken
        # The newest skip ahead of the run's first copy (0: none), and its ack subject: it belongs
        # to what the copier already holds. A skip after a copy is noted on that copy's entry.
        self.seq = 0
        self.reply = ""
        self.lag: str | None = None  # pending count of the last delivery taken (None: none taken)
        # The delivery the run stopped at because its verdict is `Pending`: taken off the buffer,
        # with its ack tokens, stream sequence and that verdict.
        self.head: RawMsg | None = None
        self.tokens: list[str] = []
        self.head_seq = 0
        self.verdict: bool | Pending = True

    @property
    def taken(self) -> int:
        return self.skipped + len(self.entries)


NOT_AN_ACK: Final = -1


def copy_entry(msg: RawMsg, tokens: list[str], seq: int, transform: MessageTransform, received: float) -> Entry:
    """A delivery's window entry, its copy built with the source timestamp its ack subject carries."""
    ts = int(tokens[ACK_TIMESTAMP])
    return Entry(msg, seq, ts, received, transform.build(msg, seq, ts))


_PROVENANCE: Final = b"\r\nStream-Replicator-Source:"  # a copy's header line (`provenance.PROVENANCE`)


def take_run(buffer: deque[RawMsg], verdict: DeliveryCheck, transform: MessageTransform, last_cseq: int,
             floor: int, most: int, room: int, plain: bool = False) -> Run:
    """Admit deliveries off the front of `buffer` (at most `most`, and at most `room` copies)
    while each one is the next of the consumer (`last_cseq` + 1) and newer than `floor` (the
    highest stream sequence the copier holds): skips are noted, copies built into entries. A
    delivery that fails either test stays in the buffer for the copier's own path, as does any
    once `room` copies are taken (its verdict is not asked: a sampling decision counts the sender
    as copied). One whose verdict is `Pending` is taken and handed back as `head`. `plain`: the
    verdict copies every delivery without a provenance header, and is asked only about copies (the
    loop guard)."""
    run = Run()
    entries = run.entries
    skipped = skipped_bytes = copied_bytes = 0
    lag: str | None = None
    last: Entry | None = None
    received = time.monotonic()
    everything = verdict is copy_everything or plain
    while buffer and skipped + len(entries) < most and len(entries) < room:
        msg = buffer[0]
        cseq, seq, tokens = _sequences(msg.reply)
        if cseq != last_cseq + 1 or seq <= floor:
            break
        buffer.popleft()
        last_cseq = cseq
        lag = tokens[ACK_PENDING]
        hdr = msg.hdr
        copy = True if everything and (hdr is None or _PROVENANCE not in hdr) else verdict(msg, tokens, seq)
        if copy is False:
            skipped += 1
            skipped_bytes += len(msg.data)
            floor = seq
            if last is None:
                run.seq, run.reply = seq, msg.reply
            else:
                last.skipped_seq, last.skipped_reply = seq, msg.reply
            continue
        if copy is True:
            last = copy_entry(msg, tokens, seq, transform, received)
            entries.append(last)
            copied_bytes += len(msg.data)
            floor = seq
            continue
        run.head, run.tokens, run.head_seq, run.verdict = msg, tokens, seq, copy
        break
    run.skipped, run.skipped_bytes, run.copied_bytes = skipped, skipped_bytes, copied_bytes
    run.last_cseq, run.lag = last_cseq, lag
    return run


def _sequences(reply: str) -> tuple[int, int, list[str]]:
    """Consumer and stream sequence of a delivery, and its ack tokens; (-1, -1, []) for a reply
    that is no ack subject (the copier's own path raises for it, as it always did)."""
    try:
        tokens = ack_tokens(reply)
        return int(tokens[ACK_CONSUMER_SEQ]), int(tokens[ACK_STREAM_SEQ]), tokens
    except ValueError:
        return NOT_AN_ACK, NOT_AN_ACK, []
