"""Runs of skipped deliveries (`take_skips`): what a run takes, where it stops, what it hands back."""

from __future__ import annotations

from collections import deque

from replicator.copier.admission import take_skips
from replicator.sampling.limiter import Pending
from replicator.transport.wire import RawMsg


def ack_subject(sseq: int, cseq: int, pending: int = 0, delivered: int = 1) -> str:
    return f"$JS.ACK.FLEET.sr.{delivered}.{sseq}.{cseq}.1732430000000000000.{pending}"


def delivery(sseq: int, cseq: int, pending: int = 0, delivered: int = 1, data: bytes = b"x" * 10) -> RawMsg:
    return RawMsg("fleet.a", ack_subject(sseq, cseq, pending, delivered), None, data)


def skip_all(_msg: RawMsg, _tokens: list[str], _seq: int) -> bool | Pending:
    return False


def test_a_run_of_skips_is_taken_whole() -> None:
    buffer = deque(delivery(100 + i, 1 + i, pending=9 - i) for i in range(10))
    run = take_skips(buffer, skip_all, 0, 99, 1000)
    assert not buffer
    assert (run.skipped, run.skipped_bytes, run.last_cseq) == (10, 100, 10)
    assert (run.seq, run.reply, run.lag) == (109, ack_subject(109, 10), "0")
    assert run.head is None


def test_the_first_copy_ends_the_run_and_comes_back_decided() -> None:
    copy_at = 103
    buffer = deque(delivery(100 + i, 1 + i) for i in range(6))

    def verdict(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        assert seq == int(tokens[5])
        return seq == copy_at

    run = take_skips(buffer, verdict, 0, 99, 1000)
    assert run.skipped == 3 and run.seq == 102
    assert run.head is not None and run.head_seq == copy_at and run.verdict is True
    assert run.tokens[5] == str(copy_at) and run.last_cseq == 4
    assert [int(m.reply.split(".")[5]) for m in buffer] == [104, 105]  # the rest wait for the next run


def test_a_decision_to_settle_comes_back_as_it_is() -> None:
    pending = Pending("node1", 0.0, 10, False)
    run = take_skips(deque([delivery(5, 1)]), lambda _m, _t, _s: pending, 0, 4, 1000)
    assert run.head is not None and run.verdict is pending and run.skipped == 0


def test_a_gap_a_redelivery_and_a_foreign_reply_stay_for_the_copier() -> None:
    asked: list[int] = []

    def verdict(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        asked.append(seq)
        return False

    gap = deque([delivery(10, 1), delivery(11, 3)])  # consumer sequence 2 never arrived
    run = take_skips(gap, verdict, 0, 9, 1000)
    assert run.skipped == 1 and run.last_cseq == 1 and len(gap) == 1

    redelivered = deque([delivery(10, 1), delivery(10, 2, delivered=2)])  # stream sequence 10 again
    run = take_skips(redelivered, verdict, 0, 9, 1000)
    assert run.skipped == 1 and len(redelivered) == 1

    held = deque([delivery(7, 1)])  # at or below what the copier holds already
    run = take_skips(held, verdict, 0, 7, 1000)
    assert run.skipped == 0 and run.lag is None and len(held) == 1

    foreign = deque([RawMsg("fleet.a", "_INBOX.abc.1", None, b"")])
    run = take_skips(foreign, verdict, 0, 0, 1000)
    assert run.skipped == 0 and len(foreign) == 1
    assert asked == [10, 10]  # no verdict was asked for anything left behind


def test_a_run_takes_at_most_what_it_is_allowed() -> None:
    buffer = deque(delivery(1 + i, 1 + i) for i in range(10))
    run = take_skips(buffer, skip_all, 0, 0, 4)
    assert run.skipped == 4 and run.seq == 4 and len(buffer) == 6


def test_ack_subjects_of_the_servers_newer_format_are_read_too() -> None:
    v2 = RawMsg("fleet.a", "$JS.ACK.hub.ACCHASH.FLEET.sr.1.42.1.1732430000000000000.0.tok", None, b"abc")
    run = take_skips(deque([v2]), skip_all, 0, 41, 1000)
    assert (run.skipped, run.seq, run.last_cseq, run.lag) == (1, 42, 1, "0")
