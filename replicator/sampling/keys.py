"""The sender key of a message: a JSON field (dotted path), a header, a subject token or the subject."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from replicator.config.model import TopicConfig
from replicator.sampling.body import REFUSED, BodyReader, field_decoder, top_level_value
from replicator.transport.header_block import HeaderView

_TRUE_STRINGS = frozenset({"true", "yes", "1"})


def key_spec(settings: TopicConfig) -> str:
    """How the key is found, as advisories and the CLI show it: `host.fqdn`, `header:X`, `token:3`."""
    if settings.inspect:
        return settings.inspect
    if settings.inspect_header:
        return f"header:{settings.inspect_header}"
    if settings.inspect_subject_token == -1:
        return "subject"
    if settings.inspect_subject_token:
        return f"token:{settings.inspect_subject_token}"
    return ""


def scalar_key(value: Any) -> str | None:
    """Only scalars identify a sender; objects, lists, null and "" do not."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or None
    if isinstance(value, int):
        return str(value)  # exact at any size (orjson refuses integers beyond 64 bits)
    if isinstance(value, float):
        return orjson.dumps(value).decode()
    return None


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """The exact name first, then any case. A block's view is neither measured (`not headers`
    would parse it whole) nor parsed for a name that appears nowhere in it, in any case."""
    if headers is None:
        return None
    value = headers.get(name)
    if value is None:
        if isinstance(headers, HeaderView) and not headers.may_hold(name):
            return None
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value or None


def is_true(value: Any) -> bool:
    """The update flag must say yes (JSON true, "true", "yes", "1"): being present is not enough."""
    if value is True:
        return True
    return isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS


def body_reader(settings: TopicConfig) -> BodyReader | None:
    """What the topic reads of a JSON body: the key's path (`inspect`), then the flag's."""
    paths = [p for p in (settings.inspect, settings.update_flag) if p]
    return BodyReader(paths) if paths else None


def _identify(
    settings: TopicConfig, reader: BodyReader | None, subject: str, headers: Mapping[str, str] | None,
    payload: bytes,
) -> tuple[str | None, bool]:
    """(sender key or None, update flag raised): the body is read once, only if needed."""
    values = reader.read(payload) if reader is not None else []
    key: str | None = None
    if settings.inspect:
        key = scalar_key(values[0])
    elif settings.inspect_header:
        key = _header(headers, settings.inspect_header)
    elif settings.inspect_subject_token == -1:  # the whole subject, as the Go tool's -1
        key = subject or None
    elif settings.inspect_subject_token:
        tokens = subject.split(".")
        n = settings.inspect_subject_token
        key = (tokens[n - 1] or None) if n <= len(tokens) else None
    if key is None:
        return None, False
    flag = settings.update_flag
    if not flag:
        return key, False
    return key, is_true(values[-1]) or is_true(_header(headers, flag))


Identify = Callable[[str, Mapping[str, str] | None, bytes], tuple[str | None, bool]]


def top_level_field(settings: TopicConfig) -> str | None:
    """The key's field when it is a top-level JSON field and nothing else of a message is read (no
    update flag): the commonest setting, which the hot paths special-case."""
    field = settings.inspect
    if not field or "." in field or settings.update_flag:
        return None
    return field


def top_level_key_of(payload: bytes, field: str) -> str | None:
    """The key by a full parse, for a body the field decoder refused (no JSON object)."""
    return scalar_key(top_level_value(payload, field))


def identifier(settings: TopicConfig) -> Identify:
    """`_identify` bound to the topic, specialised for a top-level field: it runs for every message."""
    field = top_level_field(settings)
    if field is None:
        return functools.partial(_identify, settings, body_reader(settings))
    decode = field_decoder(field)

    def top_level(subject: str, headers: Mapping[str, str] | None, payload: bytes) -> tuple[str | None, bool]:
        try:
            value = decode(payload).value
        except REFUSED:
            return top_level_key_of(payload, field), False
        return scalar_key(value), False

    return top_level
