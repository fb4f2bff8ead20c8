"""Shared helpers for the operator tests: the CRD, its schema and CEL rules, example resources,
Kubernetes schema validation, and a worker config materialised into a temporary directory."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import yaml
from replication_operator.build import worker_config
from replication_operator.build.children import Children
from replication_operator.checks import policy
from replication_operator.model import naming

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "streamreplications.streamreplicator.io.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# The Spark operator's CRDs sit next to the repository (../shared), or next to the folder of git
# worktrees that share it (../../shared).
SPARK_CRDS = next(
    (p for p in (ROOT.parent / "shared" / "external" / "spark-operator-crds",
                 ROOT.parent.parent / "shared" / "external" / "spark-operator-crds") if p.exists()),
    ROOT.parent / "shared" / "external" / "spark-operator-crds",
)
K8S_VERSION = "1.33"


@functools.cache
def crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD_PATH.read_text()))


def schema() -> dict[str, Any]:
    return dict(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def example_resources(pooled: bool | None = None) -> list[dict[str, Any]]:
    """Every StreamReplication in examples/ (files may hold several documents); `pooled`: only those
    with (True) or without (False) `spec.pool` (a pool's objects are built by build/pool.py)."""
    found = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == naming.KIND and pooled in (None, bool(doc["spec"].get("pool"))):
                found.append(doc)
    return found


def example_connections() -> dict[str, dict[str, Any]]:
    """Every NatsConnection's spec in examples/, by name."""
    found = {}
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == naming.CONNECTION_KIND:
                found[doc["metadata"]["name"]] = doc["spec"]
    return found


def inline_connections(resource: dict[str, Any]) -> dict[str, Any]:
    """The resource with each side's connectionRef replaced by that example NatsConnection's fields,
    as the reconciler lays them in (model/connection.py `resolved`)."""
    for side in ("source", "target"):
        ref = resource["spec"][side].pop("connectionRef", None)
        if ref is not None:
            resource["spec"][side].update(copy.deepcopy(example_connections()[ref["name"]]))
    return resource


def example(name: str, namespace: str = "replication") -> dict[str, Any]:
    """An example StreamReplication, its NatsConnections laid in (as the builders see it)."""
    for doc in example_resources():
        if doc["metadata"]["name"] == name:
            doc = inline_connections(copy.deepcopy(doc))
            doc["metadata"]["namespace"] = namespace
            doc["metadata"].setdefault("uid", f"uid-{name}")
            doc["metadata"].setdefault("generation", 1)
            return doc
    raise KeyError(name)


# ---- the CRD schema, as an API server would apply it ----
def _openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 structural schema -> JSON Schema: int-or-string and preserve-unknown-fields."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    out.pop("format", None) if node.get("format") in ("int32", "int64") else None
    return out


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: a property's default fills in when the property is absent."""
    if not isinstance(value, dict) or node.get("type") != "object":
        if isinstance(value, list) and "items" in node:
            return [apply_defaults(node["items"], v) for v in value]
        return value
    out = dict(value)
    for key, prop in (node.get("properties") or {}).items():
        if key not in out and "default" in prop:
            out[key] = copy.deepcopy(prop["default"])
        if key in out:
            out[key] = apply_defaults(prop, out[key])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        for key in out:
            if key not in (node.get("properties") or {}):
                out[key] = apply_defaults(extra, out[key])
    return out


_cel_env = celpy.Environment()


@functools.cache
def _cel_program(rule: str) -> Any:
    return _cel_env.program(_cel_env.compile(rule))


def cel_rules(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(path, schema node, rule) for every x-kubernetes-validations rule."""
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations") or []:
            yield path, node, rule
        for key, child in (node.get("properties") or {}).items():
            yield from cel_rules(child, f"{path}.{key}" if path else key)
        if isinstance(node.get("items"), dict):
            yield from cel_rules(node["items"], f"{path}[]")


def _at(value: Any, path: str) -> Any:
    for part in filter(None, path.split(".")):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def cel_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Messages of the CEL rules the object breaks (transition rules only with `old`)."""
    errors = []
    for path, _node, rule in cel_rules(schema()):
        value = _at(obj, path)
        if value is None:
            continue
        text = rule["rule"]
        activation: dict[str, Any] = {"self": celpy.json_to_cel(value)}
        if "oldSelf" in text:
            before = _at(old, path) if old is not None else None
            if before is None:
                continue
            activation["oldSelf"] = celpy.json_to_cel(before)
        result = _cel_program(text).evaluate(activation)
        if isinstance(result, celpy.CELEvalError):
            raise AssertionError(f"CEL rule {text!r} failed to evaluate at {path}: {result}")
        if not bool(result):
            errors.append(f"{path}: {rule['message']}")
    return errors


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    """RFC 3339, as the API server checks `format: date-time` (jsonschema needs an extra package)."""
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return True


def schema_errors(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(_openapi_to_jsonschema(schema()), format_checker=FORMATS)
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def cr_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the API server would reject: the OpenAPI schema (after defaulting), then the CEL rules."""
    defaulted = apply_defaults(schema(), obj)
    errors = schema_errors(defaulted)
    if errors:
        return errors
    return cel_errors(defaulted, apply_defaults(schema(), old) if old else None)


def validate_k8s(obj: dict[str, Any]) -> None:
    """Against the real Kubernetes OpenAPI schemas (strict: unknown fields are errors)."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---- the worker config, made loadable outside a pod ----
def fake_secret(name: str, namespace: str, data: dict[str, bytes], usable: bool = True) -> dict[str, Any]:
    """A Secret; `usable` labels it for StreamReplications (the operator's default policy wants it)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if usable:
        metadata["labels"] = {policy.USABLE_LABEL: policy.USABLE_VALUE}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def materialise(
    config_text: str,
    root: Path,
    secrets: dict[str, dict[str, bytes]] | None = None,
    mounts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The config with pod paths rewritten under `root`, and the mounted files written there.

    `mounts` maps a pod directory to the Secret mounted there (from the Deployment's volumes).
    """
    config = yaml.safe_load(config_text)
    for pod_dir, secret in (mounts or {}).items():  # a ConfigMap's data is passed like a Secret's
        target = root / pod_dir.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for key, value in ((secrets or {}).get(secret) or {}).items():
            (target / key).write_bytes(value)

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: rewrite(v) for k, v in node.items()}
        if isinstance(node, str) and node.startswith(("/etc/", "/var/")):
            return str(root / node.lstrip("/"))
        return node

    config = rewrite(config)
    Path(config["state_dir"]).mkdir(parents=True, exist_ok=True)
    return dict(config)


def secret_mounts(deployment: dict[str, Any]) -> dict[str, str]:
    """Pod directory -> Secret name, from a Deployment's volumes and mounts."""
    pod = deployment["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = pod["containers"][0]["volumeMounts"]
    return {m["mountPath"]: secrets[m["name"]] for m in mounts if m["name"] in secrets}


def config_map_mounts(deployment: dict[str, Any]) -> dict[str, str]:
    """Pod directory -> ConfigMap name, for the ConfigMaps a Deployment mounts besides its own config
    (a CA bundle)."""
    pod = deployment["spec"]["template"]["spec"]
    maps = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v and v["name"] != "config"}
    mounts = pod["containers"][0]["volumeMounts"]
    return {m["mountPath"]: maps[m["name"]] for m in mounts if m["name"] in maps}


ALL_TLS = frozenset(worker_config.ALL_TLS_KEYS)


class Api:
    """Test-side API calls against the emulator, as kubectl would make them."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    async def _send(
        self, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.cluster.request(method, path, json=body, headers=headers) as resp:
            data = await resp.json()
            assert resp.status < 300, (resp.status, data)
            return dict(data)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = naming.kind_of(obj)
        return await self._send("POST", kind.path(obj["metadata"]["namespace"]), obj)

    async def patch(
        self,
        kind: naming.Kind,
        namespace: str,
        name: str,
        body: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return await self._send("PATCH", kind.path(namespace, name, subresource), body)

    async def delete(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any]:
        return await self._send("DELETE", kind.path(namespace, name))

    def get(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cluster.get(kind, namespace, name)  # type: ignore[no-any-return]

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Events posted about a resource, oldest first."""
        found = []
        for (resource, ns, _), obj in self.cluster.objects.items():
            if resource.plural != "events" or ns != namespace or obj.deleted:
                continue
            raw = obj.raw
            if raw.get("involvedObject", {}).get("name") == name:
                found.append(raw)
        return found

    def reasons(self, namespace: str, name: str) -> list[str]:
        return [e.get("reason", "") for e in self.events(namespace, name)]


def contains_fields(restored: dict[str, Any], original: dict[str, Any]) -> bool:
    """Same content (spec or data) as the original, whatever the identity (uid, resourceVersion)."""
    return all(restored.get(k) == original.get(k) for k in ("spec", "data") if k in original)


# ---- the fleet-health summary the operator reads from the KV bucket ----
def fleet_summary(sites: dict[str, tuple[int, int, int]], run: int = 1, last_run: int = 1767225600) -> bytes:
    """A `summary` document as the job writes it (replicator/fleet_health/summary.py): per site
    (healthy, timeout, expired); totals and availability computed as the job computes them."""
    import json

    def row(healthy: int, timeout: int, expired: int) -> dict[str, Any]:
        reporting = healthy + timeout
        return {"nodes": healthy + timeout + expired, "healthy": healthy, "timeout": timeout, "expired": expired,
                "availability": round(healthy / reporting, 6) if reporting else None}

    totals = [sum(counts[i] for counts in sites.values()) for i in range(3)]
    return json.dumps({
        "$schema": "stream-replicator/v1/fleet_health_summary", "stream": "ADVISORIES", "run": run,
        "last_run": last_run, "last_sequence": 10 * run,
        "fleet": {"sites": len(sites), **row(*totals)},
        "sites": [{"replicator": name, **row(*counts)} for name, counts in sorted(sites.items())],
        "advisories": 10 * run, "duplicates": 0, "malformed": 0,
    }).encode()


def child_of(children: Children, kind: naming.Kind) -> dict[str, Any] | None:
    """The child of this kind among those built, if any."""
    return next((o for o in children.objects if (o["apiVersion"], o["kind"]) == (kind.api_version, kind.kind)), None)
