"""The StreamReplication CRD: a valid CRD object, structural, and rejecting what would not work."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from replication_operator.model import crd, images
from replication_operator.model.openapi import fields_without_description
from replication_operator.model.spec import parse_spec

from tests.operator import helpers as h

JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
FORBIDDEN_IN_JUNCTORS = ("type", "default", "description", "nullable", "additionalProperties")


def test_crd_is_a_valid_kubernetes_object() -> None:
    h.validate_k8s(h.crd())


def test_crd_names_and_subresources() -> None:
    crd = h.crd()
    assert crd["metadata"]["name"] == "streamreplications.streamreplicator.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "StreamReplication",
        "streamreplications",
        ["srep"],
    )
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Engine", "Mode", "Replicas", "Ready", "Lag", "Age", "Status"]


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            yield from _walk(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _walk(child, f"{path}/{i}")


def test_schema_is_structural() -> None:
    """What the API server requires of a structural schema (it would refuse the CRD otherwise)."""
    schema = h.schema()
    int_or_string = {p for p, n in _walk(schema) if n.get("x-kubernetes-int-or-string")}
    for path, node in _walk(schema):
        parent = path.rsplit("/", 1)[-1]
        in_junctor = any(f"/{j}/" in path + "/" for j in JUNCTORS)
        if (
            in_junctor
            and path.rsplit("/anyOf/", 1)[0] in int_or_string
            and node in ({"type": "integer"}, {"type": "string"})
        ):
            continue  # the one allowed form: int-or-string's anyOf of integer and string
        if in_junctor:
            bad = [k for k in FORBIDDEN_IN_JUNCTORS if k in node]
            assert not bad, f"{path}: {bad} not allowed inside a logical junctor"
            continue
        if parent in (
            "properties",
            "x-kubernetes-validations",
            "enum",
            "required",
            "x-kubernetes-list-map-keys",
        ):
            continue
        if "properties" in node or "items" in node or "additionalProperties" in node:
            assert "type" in node, f"{path}: a schema node needs a type"
        if "items" in node:
            assert node["type"] == "array", path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path


def test_every_junctor_field_is_declared_outside() -> None:
    """oneOf branches only name properties the structural part declares."""
    for path, node in _walk(h.schema()):
        for junctor in ("oneOf", "anyOf", "allOf"):
            for branch in node.get(junctor, []):
                for key in branch.get("required", []):
                    assert key in node["properties"], f"{path}: {junctor} requires undeclared {key}"


@pytest.mark.parametrize("path", [h.CRD_PATH, h.ROOT / "helm" / "stream-replicator" / "crds" / h.CRD_PATH.name],
                         ids=["crds", "chart"])
def test_the_committed_crd_is_the_one_the_typed_models_generate(path: Path) -> None:
    """One source of truth: the models in operator/model/ (`make crd` writes both files)."""
    assert path.read_text() == crd.render(), f"{path.relative_to(h.ROOT)} differs from the typed models: run make crd"
    assert crd.main(["--check", str(path)]) == 0


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    assert fields_without_description(h.schema()) == []
    spec = h.schema()["properties"]["spec"]["properties"]
    assert images.WORKER_IMAGE_ENV in spec["image"]["description"]  # the variable the chart really sets
    assert images.SPARK_IMAGE_ENV in spec["fleetHealth"]["properties"]["image"]["description"]


def test_crd_check_names_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / h.CRD_PATH.name
    stale.write_text(crd.render().replace("Subject to copy from the source", "Subject to copy"))
    assert crd.main(["--check", str(stale)]) == 1
    assert "differs from the typed models" in capsys.readouterr().err
    assert crd.main([str(stale)]) == 0 and stale.read_text() == crd.render()


@pytest.mark.parametrize("resource", h.example_resources(), ids=lambda r: r["metadata"]["name"])
def test_an_object_the_api_server_never_defaulted_reads_like_a_defaulted_one(resource: dict[str, Any]) -> None:
    """The models carry the CRD's defaults (they are its source), so objects written before a default
    existed, or into the test emulator, behave the same."""
    assert parse_spec(resource) == parse_spec(h.apply_defaults(h.schema(), resource))


def test_defaults_are_valid() -> None:
    minimal = {
        "apiVersion": "streamreplicator.io/v1alpha1",
        "kind": "StreamReplication",
        "metadata": {"name": "minimal"},
        "spec": {"topic": "a.b", "source": {"url": "nats://a:4222"}, "target": {"url": "nats://b:4222"}},
    }
    defaulted = h.apply_defaults(h.schema(), minimal)
    assert defaulted["spec"]["mode"] == "ordered"
    assert defaulted["spec"]["monitoring"] == {"port": 8080}
    assert h.cr_errors(minimal) == []


def test_cel_rules_compile_and_pass_on_examples() -> None:
    rules = list(h.cel_rules(h.schema()))
    assert len(rules) >= 10
    for resource in h.example_resources():
        assert h.cr_errors(resource) == [], resource["metadata"]["name"]


@pytest.mark.parametrize("resource", h.example_resources(), ids=lambda r: r["metadata"]["name"])
def test_examples_are_valid(resource: dict[str, Any]) -> None:
    assert h.cr_errors(resource) == []


def _base() -> dict[str, Any]:
    return {
        "apiVersion": "streamreplicator.io/v1alpha1",
        "kind": "StreamReplication",
        "metadata": {"name": "bad"},
        "spec": {
            "topic": "acme.cmdb",
            "source": {"url": "nats://source:4222"},
            "target": {"url": "nats://target:4222"},
        },
    }


def _with(path: str, value: Any) -> dict[str, Any]:
    obj = _base()
    node = obj
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return obj


def _spec(**fields: Any) -> dict[str, Any]:
    obj = _base()
    obj["spec"].update(fields)
    return obj


_DELETE = object()
SAMPLING = {"inspect": "host", "age": "5m"}

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no spec", {k: v for k, v in _base().items() if k != "spec"}, "spec"),
    ("no topic", _with("spec.topic", _DELETE), "topic"),
    ("no source", _with("spec.source", _DELETE), "source"),
    ("no target url", _with("spec.target", {"stream": "X"}), "url"),
    ("topic with space", _with("spec.topic", "acme cmdb"), "does not match"),
    ("topic with empty token", _with("spec.topic", "acme..cmdb"), "does not match"),
    ("'>' not last", _with("spec.topic", "acme.>.cmdb"), "does not match"),
    ("http url", _with("spec.source.url", "http://source:4222"), "does not match"),
    ("url with path", _with("spec.target.url", "nats://target:4222/x"), "does not match"),
    ("stream with dot", _with("spec.source.stream", "CM.DB"), "does not match"),
    ("prefix with wildcard", _with("spec.target.subjectPrefix", "city.*"), "does not match"),
    ("unknown mode", _with("spec.mode", "parallel"), "is not one of"),
    ("negative replicas", _with("spec.replicas", -1), "minimum"),
    ("zero workers", _spec(mode="scaled", workersPerPod=0), "minimum"),
    ("ordered with workers", _with("spec.workersPerPod", 4), "needs mode: scaled"),
    ("queue group in ordered mode", _with("spec.queueGroup", "grp"), "mode: scaled only"),
    ("bad duration", _with("spec.maxAge", "5 minutes"), "does not match"),
    ("duration without unit", _with("spec.maxAge", "300"), "does not match"),
    ("dead letter with a wildcard", _with("spec.deadLetter", "poison.>"), "does not match"),
    ("dead letter with a space", _with("spec.deadLetter", "poison msgs"), "does not match"),
    ("two start positions", _with("spec.start", {"sequence": 5, "atEnd": True}), "valid under each"),
    ("empty start", _with("spec.start", {}), "not valid under any"),
    ("start time not RFC 3339", _with("spec.start", {"time": "2026-01-01 10:00"}), "date-time"),
    ("start sequence 0", _with("spec.start", {"sequence": 0}), "minimum"),
    ("sampling without key", _with("spec.sampling", {"age": "5m"}), "not valid under any"),
    (
        "sampling with two keys",
        _with("spec.sampling", {"inspect": "a", "inspectHeader": "B", "age": "5m"}),
        "valid under each",
    ),
    ("sampling without age", _with("spec.sampling", {"inspect": "host"}), "age"),
    ("subject token 0", _with("spec.sampling", {"inspectSubjectToken": 0, "age": "5m"}), "minimum"),
    ("advisory without sampling", _with("spec.advisory", {"subject": "adv"}), "advisory needs sampling"),
    ("advisory wildcard subject", _spec(sampling=SAMPLING, advisory={"subject": "adv.*"}), "does not match"),
    (
        "advisory on a third cluster",
        _spec(sampling=SAMPLING, advisory={"subject": "adv", "cluster": "central"}),
        "is not one of",
    ),
    (
        "fleet health without advisory",
        _spec(sampling=SAMPLING, fleetHealth={"schedule": "@every 15m", "output": "/data/fleet"}),
        "fleetHealth needs advisory",
    ),
    (
        "fleet health without output",
        _spec(sampling=SAMPLING, advisory={"subject": "adv"}, fleetHealth={"schedule": "@every 15m"}),
        "output",
    ),
    (
        "fleet health bad schedule",
        _spec(
            sampling=SAMPLING,
            advisory={"subject": "adv"},
            fleetHealth={"schedule": "every hour", "output": "/data/fleet"},
        ),
        "does not match",
    ),
    (
        "fleet health to gs:// without its connector",
        _spec(sampling=SAMPLING, advisory={"subject": "adv"}, fleetHealth={"output": "gs://fleet/x"}),
        "needs the GCS connector",
    ),
    (
        "fleet health to abfss:// with another package",
        _spec(sampling=SAMPLING, advisory={"subject": "adv"},
              fleetHealth={"output": "abfss://c@a.dfs.core.windows.net/x", "packages": ["org.example:x:1"]}),
        "needs the Azure connector",
    ),
    (
        "fleet health s3 settings without s3a output",
        _spec(sampling=SAMPLING, advisory={"subject": "adv"},
              fleetHealth={"output": "/data/fleet", "s3": {"credentialsSecret": {"name": "s3"}}}),
        "fleetHealth.s3 is for an s3a:// output",
    ),
    (
        "memory limiter with many workers",
        _spec(mode="scaled", replicas=3, sampling={**SAMPLING, "limiterState": "memory"}),
        "limiterState must be kv",
    ),
    ("credentials without name", _with("spec.source.credentialsSecret", {"key": "user.creds"}), "name"),
    ("secret name with capitals", _with("spec.target.tlsSecret", "My-TLS"), "does not match"),
    ("port below 1024", _with("spec.monitoring", {"port": 80}), "minimum"),
    (
        "unknown toleration operator",
        _with("spec.tolerations", [{"key": "a", "operator": "In"}]),
        "is not one of",
    ),
    ("bad quantity", _with("spec.resources", {"limits": {"memory": "lots"}}), "does not match"),
    ("name with capitals", _base() | {"metadata": {"name": "Bad"}}, "DNS-1035"),
    ("name too long", _base() | {"metadata": {"name": "a" * 51}}, "DNS-1035"),
    ("name starting with a digit", _base() | {"metadata": {"name": "1st"}}, "DNS-1035"),
]


@pytest.mark.parametrize(("case", "resource", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_crd_rejects(case: str, resource: dict[str, Any], expected: str) -> None:
    errors = h.cr_errors(resource)
    assert errors, f"{case}: accepted"
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    ("field", "before", "after"),
    [
        ("mode", "ordered", "scaled"),
        ("name", "A", "B"),
        ("queueGroup", "g1", "g2"),
    ],
)
def test_consumer_identity_is_immutable(field: str, before: str, after: str) -> None:
    old = _base()
    if field == "queueGroup":
        old["spec"]["mode"] = "scaled"
    old["spec"][field] = before
    new = copy.deepcopy(old)
    new["spec"][field] = after
    assert h.cr_errors(old) == []
    assert any("immutable" in e for e in h.cr_errors(new, old))
    same = copy.deepcopy(old)
    same["spec"]["replicas"] = 3
    assert h.cr_errors(same, old) == []


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.sampling", {"age": "5m"}, "exactly one of inspect, inspectHeader, inspectSubjectToken"),
        ("spec.sampling", {"inspect": "a", "inspectSubjectToken": 2, "age": "5m"}, "exactly one of inspect"),
        ("spec.start", {"delta": "1h", "time": "2026-01-01T00:00:00Z"}, "exactly one of sequence, time"),
    ],
)
def test_one_of_rules_also_have_readable_cel_messages(path: str, value: Any, message: str) -> None:
    """The oneOf (checked by any JSON Schema validator) has a CEL twin that says what to fix."""
    resource = h.apply_defaults(h.schema(), _with(path, value))
    assert any(message in e for e in h.cel_errors(resource))
