"""Runs of skipped deliveries, taken in one compiled call (`setup.py` compiles this module).

At fleet rates 11 of 12 deliveries are sampled out. Each one is an ack subject to read, a
sampling decision and a note of the newest skipped sequence; in the ordered copier's interpreted
loop that was over half its time (cProfile, 1.2 million fleet deliveries: the copier's `_admit`,
5.0 of 9.0 s). `take_skips` takes the whole run at once and stops at the first delivery that is
not a plain skip: a copy, a decision only the state store can settle, a gap in the consumer's
sequence or a redelivery. The copier keeps every rule about those.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from replicator.sampling.limiter import DeliveryCheck, Pending
from replicator.transport.wire import ACK_CONSUMER_SEQ, ACK_PENDING, ACK_STREAM_SEQ, RawMsg, ack_tokens


class Run:
    """What `take_skips` did, for the copier to apply once per run."""

    def __init__(self) -> None:
        self.skipped = 0  # deliveries skipped, taken off the buffer
        self.skipped_bytes = 0
        self.last_cseq = 0  # consumer sequence of the last delivery taken
        self.seq = 0  # stream sequence of the last one skipped (0: none), and its ack subject
        self.reply = ""
        self.lag: str | None = None  # pending count of the last delivery taken (None: none taken)
        # The delivery the run stopped at, taken off the buffer because its verdict was asked
        # (a copy, or `Pending`): its ack tokens, stream sequence and that verdict.
        self.head: RawMsg | None = None
        self.tokens: list[str] = []
        self.head_seq = 0
        self.verdict: bool | Pending = True


NOT_AN_ACK: Final = -1


def take_skips(buffer: deque[RawMsg], verdict: DeliveryCheck, last_cseq: int, floor: int, most: int) -> Run:
    """Skip deliveries off the front of `buffer` (at most `most`) while each one is the next of the
    consumer (`last_cseq` + 1), newer than `floor` (the highest stream sequence the copier holds)
    and sampled out. A delivery that fails either test stays in the buffer for the copier's own
    path; one whose verdict is a copy or `Pending` is taken and handed back as `head`."""
    run = Run()
    skipped = skipped_bytes = 0
    lag: str | None = None
    while buffer and skipped < most:
        msg = buffer[0]
        cseq, seq, tokens = _sequences(msg.reply)
        if cseq != last_cseq + 1 or seq <= floor:
            break
        buffer.popleft()
        last_cseq = cseq
        lag = tokens[ACK_PENDING]
        copy = verdict(msg, tokens, seq)
        if copy is False:
            skipped += 1
            skipped_bytes += len(msg.data)
            floor = seq
            run.seq = seq
            run.reply = msg.reply
            continue
        run.head, run.tokens, run.head_seq, run.verdict = msg, tokens, seq, copy
        break
    run.skipped, run.skipped_bytes, run.last_cseq, run.lag = skipped, skipped_bytes, last_cseq, lag
    return run


def _sequences(reply: str) -> tuple[int, int, list[str]]:
    """Consumer and stream sequence of a delivery, and its ack tokens; (-1, -1, []) for a reply
    that is no ack subject (the copier's own path raises for it, as it always did)."""
    try:
        tokens = ack_tokens(reply)
        return int(tokens[ACK_CONSUMER_SEQ]), int(tokens[ACK_STREAM_SEQ]), tokens
    except ValueError:
        return NOT_AN_ACK, NOT_AN_ACK, []
