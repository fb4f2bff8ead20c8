"""Sampling keys from each source, update flags, and payloads that must not break anything."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from replicator.config import TopicConfig
from replicator.sampling.keys import identifier, is_true, key_spec, scalar_key
from replicator.sampling.limiter import splay
from replicator.transport.header_block import encode, view
from tests.sampling.helpers import make_profile


def extract_key(settings: TopicConfig, subject: str, headers: Mapping[str, str] | None, payload: bytes) -> str | None:
    """The sender identity of one message, as the limiter's key function gives it."""
    return identifier(settings)(subject, headers, payload)[0]


def settings(**kw: object):  # type: ignore[no-untyped-def]
    base = {"inspect": None}
    base.update(kw)
    return make_profile(**base).settings


def test_json_field_top_level_and_nested_path() -> None:
    top = settings(inspect="sender")
    assert extract_key(top, "a.b", None, b'{"sender": "n1.example.net"}') == "n1.example.net"
    nested = settings(inspect="identity.host.fqdn")
    payload = json.dumps({"identity": {"host": {"fqdn": "n2.example.net"}}}).encode()
    assert extract_key(nested, "a.b", None, payload) == "n2.example.net"
    # a literal dotted key wins; list items by index; numbers and booleans become text
    assert extract_key(nested, "a", None, b'{"identity.host.fqdn": "lit"}') == "lit"
    assert extract_key(settings(inspect="hosts.1"), "a", None, b'{"hosts": ["x", "y"]}') == "y"
    assert extract_key(settings(inspect="id"), "a", None, b'{"id": 42}') == "42"


@pytest.mark.parametrize(
    "payload",
    [
        b"not json at all",
        b"\x00\xff\xfe binary \x80",
        b'{"sender": ',  # truncated
        b'{"other": "x"}',  # missing field
        b'["sender", "x"]',  # not an object
        b'"sender"',
        b"null",
        b"",
        b'{"sender": null}',
        b'{"sender": ""}',
        b'{"sender": {"nested": "object"}}',
        b'{"sender": ["a"]}',
        b"[" * 100_000,  # deeper than the parser allows
    ],
)
def test_unusable_payloads_have_no_key(payload: bytes) -> None:
    assert extract_key(settings(inspect="sender"), "acme.cmdb", None, payload) is None


@pytest.mark.parametrize(
    ("field", "payload"),
    [
        ("sender", b'{"sender": "a", "sender": "b"}'),  # duplicated: the last one, as a full parse
        ("sender", b'{"x": {"sender": "nested"}, "y": [{"sender": 1}]}'),  # only the top level counts
        ("sender", b'{"x": {"sender": "nested"}, "sender": "top"}'),
        ("sender", b'{"sender": 7.5e3}'),
        ("sender", b'{"sender": true}'),
        ("sender", b'{"sender": "\\u00e9t\\u00e9 \\"quoted\\""}'),
        ("s\u00e9nder id", '{"s\u00e9nder id": "spaced"}'.encode()),
        ("a\"b", b'{"a\\"b": "quote in the name"}'),
        ("sender", b'  {"sender": "padded"}  '),
        ("sender", b'{"sender": "x"} trailing'),
        ("sender", b'{"big": 123456789012345678901234567890, "sender": "after a big number"}'),
        ("sender", b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b', "sender": "after deep nesting"}'),
    ],
)
def test_the_top_level_field_reader_agrees_with_a_full_parse(field: str, payload: bytes) -> None:
    """The key field is read without building the rest of the document (`field_decoder`); what it
    finds must be what a full parse and `scalar_key` find."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        expected = None
    else:
        expected = scalar_key(doc.get(field)) if isinstance(doc, dict) else None
    assert extract_key(settings(inspect=field), "a", None, payload) == expected


def test_bytes_that_are_not_utf8_elsewhere_do_not_hide_the_key() -> None:
    """The reader steps over other fields without decoding them: a stray byte there leaves the
    sender readable (a full parse refused the whole document, and the message went keyless)."""
    assert extract_key(settings(inspect="sender"), "a", None, b'{"blob": "\xff\xfe", "sender": "n1"}') == "n1"
    assert extract_key(settings(inspect="sender"), "a", None, b'{"sender": "\xff"}') is None


def test_header_key_exact_then_case_insensitive() -> None:
    s = settings(inspect_header="Sr-Sender")
    assert extract_key(s, "x", {"Sr-Sender": "n1"}, b"\x00binary") == "n1"
    assert extract_key(s, "x", {"sr-sender": "n2"}, b"") == "n2"
    assert extract_key(s, "x", {"Other": "n3"}, b"") is None
    assert extract_key(s, "x", None, b"") is None
    assert extract_key(s, "x", {"Sr-Sender": ""}, b"") is None


def test_subject_token_is_one_based() -> None:
    s = settings(inspect_subject_token=3)
    assert extract_key(s, "fleet.registration.n1-example-net.cmdb", None, b"") == "n1-example-net"
    assert extract_key(s, "fleet.registration", None, b"") is None


def test_key_spec_names_the_source() -> None:
    assert key_spec(settings(inspect="host.fqdn")) == "host.fqdn"
    assert key_spec(settings(inspect_header="Sender")) == "header:Sender"
    assert key_spec(settings(inspect_subject_token=3)) == "token:3"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), ("true", True), ("TRUE", True), ("yes", True), ("1", True), (" yes ", True),
     (False, False), ("false", False), ("no", False), ("0", False), ("", False), (None, False),
     (0, False), ({}, False), ("updated", False)],
)
def test_update_flag_must_say_yes(value: object, expected: bool) -> None:
    assert is_true(value) is expected


def test_splay_is_deterministic_and_within_ten_percent() -> None:
    values = [splay(f"node-{n}", 100.0) for n in range(2000)]
    assert values == [splay(f"node-{n}", 100.0) for n in range(2000)]
    assert all(0 <= v < 10.0 for v in values)
    assert max(values) > 9.0 and min(values) < 1.0  # actually spread, not one constant


def test_integers_beyond_64_bits_stay_exact_keys() -> None:
    """Node ids of 30 digits: two of them, one apart, are two senders (a float would merge them)."""
    for path, wrap in (("id", lambda v: {"id": v}), ("identity.id", lambda v: {"identity": {"id": v}}),
                       ("hosts.0.id", lambda v: {"hosts": [{"id": v}]}),  # a list index: the full parse
                       ('say "id"', lambda v: {'say "id"': v})):  # a name msgspec cannot rename: the full parse
        keys = {extract_key(settings(inspect=path), "a", None, json.dumps(wrap(10**29 + n)).encode()) for n in (1, 2)}
        assert keys == {str(10**29 + 1), str(10**29 + 2)}


def test_a_header_key_from_a_raw_block_in_any_case_without_parsing_for_an_absent_name() -> None:
    s = settings(inspect_header="Sr-Sender")
    exact, other_case, absent = (view(encode(h)) for h in ({"Sr-Sender": "n1"}, {"sr-sender": "n2"}, {"Other": "n3"}))
    assert extract_key(s, "x", exact, b"") == "n1"
    assert extract_key(s, "x", other_case, b"") == "n2"
    assert extract_key(s, "x", absent, b"") is None
    assert absent is not None and absent._parsed is None  # a name found nowhere: the block was not parsed
