"""The sender key of a message: a JSON field (dotted path), a header, a subject token or the subject."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from orjson import loads as orjson_loads

from replicator.config.model import TopicConfig

_TRUE_STRINGS = frozenset({"true", "yes", "1"})
_MISSING = object()


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


def lookup(doc: Any, path: str) -> Any:
    """A dotted path into nested objects (list items by index); `_MISSING` when absent.

    A literal key containing dots wins over the nested reading, so `{"a.b": 1}` works too.
    """
    if isinstance(doc, dict) and path in doc:
        return doc[path]
    node = doc
    for part in path.split("."):
        if isinstance(node, dict):
            if part not in node:
                return _MISSING
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def scalar_key(value: Any) -> str | None:
    """Only scalars identify a sender; objects, lists, null and "" do not."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or None
    if isinstance(value, int | float):
        return orjson.dumps(value).decode()
    return None


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value or None


def is_true(value: Any) -> bool:
    """The update flag must say yes (JSON true, "true", "yes", "1"): being present is not enough."""
    if value is True:
        return True
    return isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS


def _parse(raw: bytes) -> Any:
    """The decoded body, or `_MISSING` when it is not JSON (binary, truncated, too deep)."""
    try:
        return orjson.loads(raw)
    except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
        return _MISSING


def _identify(
    settings: TopicConfig, subject: str, headers: Mapping[str, str] | None, payload: bytes
) -> tuple[str | None, bool]:
    """(sender key or None, update flag raised): the body is parsed at most once, only if needed."""
    doc = _parse(payload) if settings.inspect or settings.update_flag else _MISSING
    key: str | None = None
    if settings.inspect:
        if isinstance(doc, dict):
            key = scalar_key(lookup(doc, settings.inspect))
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
    forced = (isinstance(doc, dict) and is_true(lookup(doc, flag))) or is_true(_header(headers, flag))
    return key, forced


Identify = Callable[[str, Mapping[str, str] | None, bytes], tuple[str | None, bool]]


def top_level_field(settings: TopicConfig) -> str | None:
    """The key's field when it is a top-level JSON field and nothing else of a message is read (no
    update flag): the commonest setting, which the hot paths special-case."""
    field = settings.inspect
    if not field or "." in field or settings.update_flag:
        return None
    return field


def identifier(settings: TopicConfig) -> Identify:
    """`_identify` bound to the topic, specialised for a top-level field: it runs for every message."""
    field = top_level_field(settings)
    if field is None:
        return functools.partial(_identify, settings)

    def top_level(subject: str, headers: Mapping[str, str] | None, payload: bytes) -> tuple[str | None, bool]:
        try:
            doc = orjson_loads(payload)  # `_parse`, inlined: this runs for every message
        except (ValueError, RecursionError):
            return None, False
        if type(doc) is not dict:
            return None, False
        value = doc.get(field)
        if type(value) is str:
            return value or None, False
        return scalar_key(value), False

    return top_level


def extract_key(
    settings: TopicConfig, subject: str, headers: Mapping[str, str] | None, payload: bytes
) -> str | None:
    """The sender identity of one message, or None when it has none (never raises)."""
    return identifier(settings)(subject, headers, payload)[0]
