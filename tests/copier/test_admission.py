"""Runs of deliveries (`take_run`): what a run takes (skips, and copies built into window entries),
where it stops, what it hands back."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from replicator.copier.admission import Run, take_run
from replicator.copier.transform import MessageTransform
from replicator.sampling.limiter import DeliveryCheck, Pending, copy_everything
from replicator.transport.wire import RawMsg
from tests.copier.helpers import profile_for, topic_config

TRANSFORM = MessageTransform(SimpleNamespace(  # type: ignore[arg-type]  # all a transform reads of its endpoints
    profile=profile_for(topic_config("nats://127.0.0.1:1", "nats://127.0.0.1:2")), source_stream="FLEET"))


def ack_subject(sseq: int, cseq: int, pending: int = 0, delivered: int = 1) -> str:
    return f"$JS.ACK.FLEET.sr.{delivered}.{sseq}.{cseq}.1732430000000000000.{pending}"


def delivery(sseq: int, cseq: int, pending: int = 0, delivered: int = 1, data: bytes = b"x" * 10) -> RawMsg:
    return RawMsg("fleet.a", ack_subject(sseq, cseq, pending, delivered), None, data)


def skip_all(_msg: RawMsg, _tokens: list[str], _seq: int) -> bool | Pending:
    return False


def run_of(buffer: deque[RawMsg], verdict: DeliveryCheck, floor: int, most: int = 1000, room: int = 1000) -> Run:
    return take_run(buffer, verdict, TRANSFORM, 0, floor, most, room)


def test_a_run_of_skips_is_taken_whole() -> None:
    buffer = deque(delivery(100 + i, 1 + i, pending=9 - i) for i in range(10))
    run = run_of(buffer, skip_all, 99)
    assert not buffer
    assert (run.skipped, run.skipped_bytes, run.last_cseq) == (10, 100, 10)
    assert (run.seq, run.reply, run.lag) == (109, ack_subject(109, 10), "0")
    assert run.head is None and run.entries == []


def test_copies_are_built_into_entries_and_each_skip_goes_with_the_copy_ahead_of_it() -> None:
    copies = {102, 103, 106}
    buffer = deque(delivery(100 + i, 1 + i) for i in range(8))

    def verdict(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        assert seq == int(tokens[5])
        return seq in copies

    run = run_of(buffer, verdict, 99)
    assert not buffer and run.head is None
    assert (run.seq, run.reply) == (101, ack_subject(101, 2))  # ahead of the first copy: the copier's
    assert [e.seq for e in run.entries] == [102, 103, 106]
    assert [(e.skipped_seq, e.skipped_reply) for e in run.entries] == [
        (0, ""), (105, ack_subject(105, 6)), (107, ack_subject(107, 8))]
    assert (run.skipped, run.skipped_bytes, run.copied_bytes, run.taken) == (5, 50, 30, 8)
    first = run.entries[0]
    assert first.ts == 1732430000000000000 and first.msg.reply == ack_subject(102, 3)
    assert first.copy.payload == b"x" * 10 and first.copy.msg_id.endswith(b":102")
    assert (run.last_cseq, run.lag) == (8, "0")


def test_a_topic_that_copies_everything_is_not_asked() -> None:
    buffer = deque(delivery(1 + i, 1 + i) for i in range(5))
    run = run_of(buffer, copy_everything, 0)
    assert [e.seq for e in run.entries] == [1, 2, 3, 4, 5] and run.skipped == 0


def test_a_decision_to_settle_comes_back_as_it_is() -> None:
    pending = Pending("node1", 0.0, 10, False)
    buffer = deque([delivery(5, 1), delivery(6, 2), delivery(7, 3)])
    run = run_of(buffer, lambda _m, _t, seq: pending if seq == 6 else True, 4)
    assert [e.seq for e in run.entries] == [5]
    assert run.head is not None and run.head_seq == 6 and run.verdict is pending and run.tokens[5] == "6"
    assert len(buffer) == 1 and run.last_cseq == 2


def test_a_gap_a_redelivery_and_a_foreign_reply_stay_for_the_copier() -> None:
    asked: list[int] = []

    def verdict(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        asked.append(seq)
        return seq == 10

    gap = deque([delivery(10, 1), delivery(11, 3)])  # consumer sequence 2 never arrived
    run = run_of(gap, verdict, 9)
    assert [e.seq for e in run.entries] == [10] and run.last_cseq == 1 and len(gap) == 1

    redelivered = deque([delivery(10, 1), delivery(10, 2, delivered=2)])  # stream sequence 10 again
    run = run_of(redelivered, verdict, 9)
    assert len(run.entries) == 1 and len(redelivered) == 1

    held = deque([delivery(7, 1)])  # at or below what the copier holds already
    run = run_of(held, verdict, 7)
    assert run.taken == 0 and run.lag is None and len(held) == 1

    foreign = deque([RawMsg("fleet.a", "_INBOX.abc.1", None, b"")])
    run = run_of(foreign, verdict, 0)
    assert run.taken == 0 and len(foreign) == 1
    assert asked == [10, 10]  # no verdict was asked for anything left behind


def test_a_run_takes_at_most_what_it_is_allowed() -> None:
    buffer = deque(delivery(1 + i, 1 + i) for i in range(10))
    run = run_of(buffer, skip_all, 0, most=4)
    assert run.skipped == 4 and run.seq == 4 and len(buffer) == 6


def test_a_full_window_takes_no_more_copies_and_asks_no_verdict_beyond_them() -> None:
    asked: list[int] = []

    def verdict(msg: RawMsg, tokens: list[str], seq: int) -> bool | Pending:
        asked.append(seq)
        return seq % 2 == 0

    buffer = deque(delivery(1 + i, 1 + i) for i in range(10))
    run = run_of(buffer, verdict, 0, room=2)
    assert [e.seq for e in run.entries] == [2, 4] and run.seq == 1 and run.entries[0].skipped_seq == 3
    assert asked == [1, 2, 3, 4] and len(buffer) == 6  # 5 waits: a sampled sender would count as copied


def test_ack_subjects_of_the_servers_newer_format_are_read_too() -> None:
    v2 = RawMsg("fleet.a", "$JS.ACK.hub.ACCHASH.FLEET.sr.1.42.1.1732430000000000000.0.tok", None, b"abc")
    run = run_of(deque([v2]), skip_all, 41)
    assert (run.skipped, run.seq, run.last_cseq, run.lag) == (1, 42, 1, "0")
