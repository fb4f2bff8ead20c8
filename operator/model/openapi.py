"""A pydantic model's JSON Schema as a Kubernetes structural schema (`openAPIV3Schema`).

Pydantic writes JSON Schema 2020-12: shared models under `$defs`, an optional field as `anyOf` with
`null`, a `title` on everything, `const` for a one-value literal. A CRD wants every node inline, no
`null`, no titles, `enum` for a constant and no `additionalProperties: true`. The description of a
nested model is the field's (what `kubectl explain` shows for that field), never the class docstring.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# The order keys are written in: what a node is first, then its rules, then its children.
ORDER = ("type", "format", "description", "required", "x-kubernetes-validations", "oneOf", "enum", "default",
         "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern",
         "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields",
         "x-kubernetes-int-or-string", "anyOf", "properties", "items", "additionalProperties")


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s schema, by its API (alias) names, as a CRD's structural schema."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    schema.pop("description", None)
    return _node(schema, defs)


def _node(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = {k: v for k, v in node.items() if k != "title"}
    branches = node.get("anyOf")
    if branches and {"type": "null"} in branches:  # an optional field: None is Python's, not the API's
        kept = [b for b in branches if b != {"type": "null"}]
        del node["anyOf"]
        if node.get("default", ...) is None:
            del node["default"]
        if len(kept) == 1:
            node = {**kept[0], **node}
        else:
            node["anyOf"] = kept
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**{k: v for k, v in target.items() if k not in ("title", "description")}, **node}
        node.pop("title", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("additionalProperties") is True:
        del node["additionalProperties"]
    if "properties" in node:
        node["properties"] = {k: _node(v, defs) for k, v in node["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _node(node[key], defs)
    if "anyOf" in node:
        node["anyOf"] = [_node(b, defs) for b in node["anyOf"]]
    if "x-kubernetes-validations" in node:  # the rule before its message, as people write them
        node["x-kubernetes-validations"] = [{"rule": r["rule"], **r} for r in node["x-kubernetes-validations"]]
    unknown = set(node) - set(ORDER)
    if unknown:
        raise ValueError(f"no place in the CRD for {sorted(unknown)}: add them to ORDER")
    return {k: node[k] for k in ORDER if k in node}


def fields_without_description(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every property (at any depth) that `kubectl explain` would show without a description."""
    missing = []
    for name, prop in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        if not prop.get("description"):
            missing.append(where)
        missing += fields_without_description(prop, where)
        for key, suffix in (("items", "[]"), ("additionalProperties", ".*")):
            if isinstance(prop.get(key), dict):
                missing += fields_without_description(prop[key], f"{where}{suffix}")
    return missing
