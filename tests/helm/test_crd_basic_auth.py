"""The chart's StreamReplication CRD, as the real Helm engine packs it, has `basicAuthSecret` on both
sides: its schema and defaults, the rules that keep it the one way to authenticate a side, and the
notes that point authors at it."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from helm_chart_support import crds, render_files

RESOURCE: dict[str, Any] = {
    "apiVersion": "streamreplicator.io/v1alpha1",
    "kind": "StreamReplication",
    "metadata": {"name": "orders-dc2"},
    "spec": {
        "topic": "orders.dc2.>",
        "source": {"url": "nats://nats.dc2.example.net:4222", "basicAuthSecret": {"name": "dc2-nats-login"}},
        "target": {"url": "tls://nats.central.example.net:4222", "tlsSecret": "central-ca",
                   "basicAuthSecret": {"name": "central-login", "usernameKey": "user", "passwordKey": "pass"}},
    },
}


def _version() -> dict[str, Any]:
    (crd,) = [c for c in crds() if c["spec"]["names"]["kind"] == "StreamReplication"]
    (version,) = crd["spec"]["versions"]
    return dict(version)


def _side(side: str) -> dict[str, Any]:
    return dict(_version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][side])


@pytest.mark.parametrize("side", ["source", "target"])
def test_both_sides_take_a_basic_auth_secret(side: str) -> None:
    field = _side(side)["properties"]["basicAuthSecret"]
    assert field["type"] == "object" and field["required"] == ["name"]
    assert {k: v.get("default") for k, v in field["properties"].items()} == {
        "name": None, "usernameKey": "username", "passwordKey": "password"}  # a kubernetes.io/basic-auth Secret's
    rules = {r["rule"]: r["message"] for r in _side(side)["x-kubernetes-validations"]}
    (exclusive,) = [m for r, m in rules.items() if r.startswith("(has(self.credentialsSecret) ? 1 : 0)")]
    assert "credentialsSecret, basicAuthSecret, tokenSecret and nkeySecret exclude each other" in exclusive
    assert "one way to authenticate a side" in rules[
        "!(has(self.basicAuthSecret) || has(self.tokenSecret) || has(self.nkeySecret)) || !has(self.url) "
        "|| !self.url.contains('@')"]
    assert [r["rule"] for r in field["x-kubernetes-validations"]] == ["self.usernameKey != self.passwordKey"]


def test_a_resource_with_basic_auth_validates_against_the_packed_crd() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    jsonschema.validate(RESOURCE, schema)
    broken = copy.deepcopy(RESOURCE)
    broken["spec"]["source"]["basicAuthSecret"] = {"usernameKey": "user"}
    with pytest.raises(jsonschema.ValidationError, match="'name' is a required property"):
        jsonschema.validate(broken, schema)
    for crd in (c for c in crds() if c["spec"]["names"]["kind"] == "StreamReplication"):
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def test_the_notes_point_at_basic_auth_secrets() -> None:
    notes = render_files()["stream-replicator/templates/NOTES.txt"]
    assert "basicAuthSecret, never in a url" in notes
