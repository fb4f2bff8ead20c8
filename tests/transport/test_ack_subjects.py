"""The delivery metadata in JetStream ack subjects, in both of the server's formats."""

from __future__ import annotations

import pytest

from replicator.transport.wire import (
    ACK_CONSUMER_SEQ,
    ACK_DELIVERED,
    ACK_PENDING,
    ACK_STREAM_SEQ,
    ACK_TIMESTAMP,
    ack_tokens,
)

FIELDS = (ACK_DELIVERED, ACK_STREAM_SEQ, ACK_CONSUMER_SEQ, ACK_TIMESTAMP, ACK_PENDING)


@pytest.mark.parametrize("reply", [
    "$JS.ACK.FLEET.sr.2.1017.1003.1732430000000000000.42",  # v1
    "$JS.ACK.hub.AbC123.FLEET.sr.2.1017.1003.1732430000000000000.42",  # v2: domain and account hash
    "$JS.ACK.hub.AbC123.FLEET.sr.2.1017.1003.1732430000000000000.42.x7Yz",  # v2 with its random token
])
def test_both_formats_give_the_same_fields(reply: str) -> None:
    tokens = ack_tokens(reply)
    assert [tokens[i] for i in FIELDS] == ["2", "1017", "1003", "1732430000000000000", "42"]


def test_anything_else_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a JetStream ack subject"):
        ack_tokens("_INBOX.abc.1")
