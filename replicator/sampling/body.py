"""Values read out of a JSON body by dotted path, without building the rest of the document.

Sampling reads one or two values of every message (the sender key, the update flag) from node
metadata that runs to kilobytes. A full parse builds every string, number and object of it only
for them to be freed again; msgspec, given the shape of what is wanted, decodes the objects on
the way to those values and steps over the rest (a 3.8 KB document of 60 nested objects: 14.0 us
parsed whole, 3.3 us read this way). Whatever msgspec cannot read that way (a list where an object
was expected, a body that is not JSON) is read by the full parse, so the answer is always the full
parse's: a repeated field counts as its last occurrence in both.
"""

from __future__ import annotations

# `_operator`: the C module behind the standard `operator`, whose name the project's `operator/`
# folder (the Kubernetes operator's sources) takes for mypy and for scripts run from a checkout.
from _operator import attrgetter
from collections.abc import Callable, Sequence
from typing import Any, Final

from msgspec import UNSET, MsgspecError, UnsetType, defstruct
from msgspec.json import Decoder
from msgspec.json import decode as decode_any

MISSING: Final = object()
"""A path that is absent (a JSON null is `None`)."""

REFUSED = (MsgspecError, ValueError, RecursionError)
"""What a decoder below raises for a body it cannot read its way (then the full parse decides)."""


def parse(raw: bytes) -> Any:
    """The whole decoded body, or `MISSING` when it is not JSON (binary, truncated, too deep).
    msgspec, not orjson: orjson turns an integer beyond 64 bits into a float, which merged two
    30-digit node ids one apart into one sender."""
    try:
        return decode_any(raw)
    except REFUSED:
        return MISSING


def lookup(doc: Any, path: str) -> Any:
    """A dotted path into nested objects (list items by index); `MISSING` when absent.

    A literal key containing dots wins over the nested reading, so `{"a.b": 1}` works too.
    """
    if isinstance(doc, dict) and path in doc:
        return doc[path]
    node = doc
    for part in path.split("."):
        if isinstance(node, dict):
            if part not in node:
                return MISSING
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def top_level_value(payload: bytes, field: str) -> Any:
    """One top-level field's value by the full parse (None: absent, null or no JSON object)."""
    doc = parse(payload)
    return doc.get(field) if type(doc) is dict else None


class Parsed:
    """A field decoder's result when the full parse read the field."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


FieldDecoder = Callable[[bytes], Any]
"""Decodes a body into an object whose `value` is one top-level field's value (None: null or
absent); raises one of `REFUSED` for a body that is not a JSON object."""


def field_decoder(field: str) -> FieldDecoder:
    """The fastest reader, for the commonest key (one top-level field): one call, one attribute.
    msgspec cannot name a field with a quote, a backslash or a control character in it: such a
    field is read by the full parse."""
    try:
        # gc=False: one is built per message and holds a scalar at most; the cyclic collector
        # need not count or walk it.
        shape = defstruct("KeyField", [("value", Any, None)], rename={"value": field}, gc=False)
    except ValueError:
        return lambda payload: Parsed(top_level_value(payload, field))
    return Decoder(shape).decode


_SCALARS = str | int | float | bool | None
_Plan = tuple[Callable[[Any], Any] | None, Callable[[Any], Any]]
"""(the top-level field named as the whole dotted path, if any; the walk along the path's fields)."""


class BodyReader:
    """Reads the values at `paths` (dotted, as `lookup` reads them) out of JSON bodies.

    The paths become one tree of msgspec structs, fields renamed to the JSON names: an object on
    the way is a struct with only the fields wanted, a value at the end is decoded whatever it is.
    A path with a list index in it (`hosts.0`), or a name msgspec cannot rename, makes the reader
    parse whole bodies.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._plans: list[_Plan] = []
        self._decode: Callable[[bytes], Any] | None = None
        if not any(part.isdigit() for path in self.paths for part in path.split(".")):
            try:
                self._decode = Decoder(self._build()).decode
            except ValueError:  # a name msgspec cannot rename
                self._plans.clear()

    def read(self, payload: bytes) -> list[Any]:
        """Each path's value, `MISSING` where absent or the body is no JSON object."""
        if self._decode is not None:
            try:
                doc = self._decode(payload)
            except REFUSED:
                pass
            else:
                values = []
                for literal, walk in self._plans:
                    if literal is not None:
                        value = literal(doc)
                        if value is not UNSET:
                            values.append(value)
                            continue
                    try:
                        value = walk(doc)  # no type met on the way has an attribute named `f<n>`
                    except AttributeError:  # a scalar, null or absent object on the way
                        value = MISSING
                    values.append(MISSING if value is UNSET else value)
                return values
        whole = parse(payload)
        if not isinstance(whole, dict):
            return [MISSING] * len(self.paths)
        return [lookup(whole, path) for path in self.paths]

    def _build(self) -> type:
        """The structs for the paths' tree; fills `_plans` with the attributes to read."""
        tree: dict[str, Any] = {}
        for path in self.paths:
            node = tree
            for part in path.split("."):
                node = node.setdefault(part, {})
        names: dict[str, str] = {}  # the top level's JSON name -> attribute
        top = self._struct(tree, names, literals=[p for p in self.paths if "." in p])
        for path in self.paths:
            parts = path.split(".")
            attrs = [names[parts[0]]] + [f"f{_child_index(tree, parts, depth)}" for depth in range(1, len(parts))]
            literal = attrgetter(names[path]) if len(parts) > 1 else None
            self._plans.append((literal, attrgetter(".".join(attrs))))
        return top

    def _struct(self, tree: dict[str, Any], names: dict[str, str] | None = None,
                literals: Sequence[str] = ()) -> type:
        fields: list[tuple[str, Any, Any]] = []
        rename: dict[str, str] = {}
        for i, (name, children) in enumerate(tree.items()):
            kind: Any = (self._struct(children) | _SCALARS | UnsetType) if children else Any
            fields.append((f"f{i}", kind, UNSET))
            rename[f"f{i}"] = name
            if names is not None:
                names[name] = f"f{i}"
        for j, literal in enumerate(dict.fromkeys(literals)):
            fields.append((f"lit{j}", Any, UNSET))
            rename[f"lit{j}"] = literal
            if names is not None:
                names[literal] = f"lit{j}"
        return defstruct("Body", fields, rename=rename, gc=False)


def _child_index(tree: dict[str, Any], parts: list[str], depth: int) -> int:
    """Position of `parts[depth]` among its siblings, the struct field it became."""
    node = tree
    for part in parts[:depth]:
        node = node[part]
    return list(node).index(parts[depth])
