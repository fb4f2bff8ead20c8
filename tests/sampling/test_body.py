"""Reading values out of JSON bodies without parsing them whole: always the full parse's answer."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from msgspec import Struct

from replicator.sampling.body import MISSING, BodyReader, field_decoder, lookup, parse

PATHS = ["sender", "identity.fqdn", "identity.updated", "identity", "a.b.c", "a.b", "hosts.0", "hosts.1.name",
         "x.y", "s\u00e9n der", "quote\"d", "back\\slash.key"]


def full_parse(payload: bytes, paths: list[str]) -> list[Any]:
    doc = parse(payload)
    return [lookup(doc, p) if isinstance(doc, dict) else MISSING for p in paths]


def meaning(values: list[Any]) -> list[Any]:
    """An object is an object (a path read into as well comes back as a struct, not a dict): sampling
    asks of it only that it is no scalar."""
    return ["an object" if isinstance(v, dict | Struct) else v for v in values]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.3:
        names = ["fqdn", "updated", "b", "c", "y", "name", "a", "identity", "pad"]
        return {rng.choice(names): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if depth < 3 and roll < 0.4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return rng.choice(["n1", "", "yes", "TRUE", 0, 1, 7.5, True, False, None, "\u00e9t\u00e9"])


def random_document(rng: random.Random) -> bytes:
    names = ["sender", "identity", "identity.fqdn", "a", "a.b", "hosts", "x", "s\u00e9n der", "quote\"d",
             "back\\slash.key", "back\\slash", "pad"]
    pairs = [(rng.choice(names), random_value(rng)) for _ in range(rng.randrange(6))]
    body = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"  # duplicates kept
    return body.encode()


@pytest.mark.parametrize("paths", [[p] for p in PATHS] + [["identity.fqdn", "identity.updated"],
                                                          ["identity", "identity.updated"], ["a.b", "a.b.c"],
                                                          ["sender", "sender"], ["hosts.0", "sender"]])
def test_a_reader_finds_what_the_full_parse_finds(paths: list[str]) -> None:
    """Random documents (nested objects and lists, repeated names, literal dotted names, scalars
    where objects were expected, names msgspec cannot rename) and some that are not JSON."""
    reader = BodyReader(paths)
    rng = random.Random(" ".join(paths))
    documents = [random_document(rng) for _ in range(400)]
    documents += [b"", b"not json", b"[1, 2]", b'"sender"', b"null", b"{", b'{"sender": NaN}',
                  b'{"identity": {"fqdn": "x"}} trailing', b"[" * 5000, b'{"sender": "\xff"}']
    for payload in documents:
        assert meaning(reader.read(payload)) == meaning(full_parse(payload, paths)), payload


def test_what_msgspec_can_read_it_reads() -> None:
    """Not everything falls back to the full parse: a plain dotted path is read by msgspec."""
    reader = BodyReader(["identity.fqdn", "identity.updated"])
    assert reader._decode is not None
    assert BodyReader(["hosts.0"])._decode is None  # a list index: parsed whole
    assert BodyReader(["quote\"d"])._decode is None  # a name msgspec cannot rename


@pytest.mark.parametrize("field", ["sender", "s\u00e9n der", "quote\"d"])
def test_the_field_decoder_reads_a_top_level_field(field: str) -> None:
    decode = field_decoder(field)
    rng = random.Random(field)
    for _ in range(300):
        payload = random_document(rng)
        doc = json.loads(payload)
        assert decode(payload).value == doc.get(field), payload
