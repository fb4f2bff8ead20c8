"""NatsConnection: a shared connection named by `connectionRef`. The CRD and its rules, what a
reference builds (the same children as the inline fields), the policy on it, and the real operator
(kopf against the API emulator): a missing connection is Stalled naming it, an edit reaches every
user's ConfigMap and Deployment, and the status lists the users and says whether a real nats-server
accepts the connection's credentials."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from replication_operator.build.children import build_children
from replication_operator.checks import policy
from replication_operator.model import crd, naming
from replication_operator.model import status as st
from replication_operator.model.connection import NatsConnectionSpec, parse_connection, resolved
from replication_operator.model.openapi import fields_without_description
from replication_operator.model.spec import SpecError, parse_spec
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.operator import helpers as h
from tests.operator.conftest import FAST
from tests.operator.helpers import Api
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for
from tests.support.nats_jwt import Key

NS = "conn"
TOKEN = "tk-shared-Zq81-s3cr3t"


def user(name: str = "orders", source: dict[str, Any] | None = None, **target: Any) -> dict[str, Any]:
    """A StreamReplication whose source names the NatsConnection `city-nats` (or `source`)."""
    source = {"connectionRef": {"name": "city-nats"}} if source is None else source
    return {
        "apiVersion": naming.API_VERSION, "kind": naming.KIND, "metadata": {"name": name, "namespace": NS},
        "spec": {"engine": "replicator", "topic": "acme.cmdb.>",
                 "source": {"stream": "CMDB", **source},
                 "target": {"stream": "CMDB_COPY", **(target or {"url": "nats://127.0.0.1:1"})}},
    }


def shared(name: str = "city-nats", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": naming.API_VERSION, "kind": naming.CONNECTION_KIND,
            "metadata": {"name": name, "namespace": NS}, "spec": spec or {"url": "nats://127.0.0.1:1"}}


def condition(api: Api, kind: str, name: str = "orders") -> dict[str, Any]:
    obj = api.get(naming.STREAM_REPLICATION, NS, name) or {}
    return next((dict(c) for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def connected(api: Api, name: str = "city-nats") -> dict[str, Any]:
    status = (api.get(naming.NATS_CONNECTION, NS, name) or {}).get("status") or {}
    return next((dict(c) for c in status.get("conditions") or [] if c["type"] == "Connected"), {})


# ---- the CRDs and the rules ----
def test_the_connection_crd_is_generated_and_described() -> None:
    for folder in (h.ROOT / "crds", h.ROOT / "helm" / "stream-replicator" / "crds"):
        assert (folder / crd.CONNECTION_FILENAME).read_text() == crd.render_connection(), "run `make crd`"
    doc = yaml.safe_load(crd.render_connection())
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert fields_without_description(schema) == []
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["url"]
    assert set(spec["properties"]) == {"url", "credentialsSecret", "basicAuthSecret", "tokenSecret", "nkeySecret",
                                       "tlsSecret", "caConfigMap", "tlsKeys"}
    assert doc["spec"]["versions"][0]["subresources"] == {"status": {}}
    sides = h.schema()["properties"]["spec"]["properties"]
    for side in ("source", "target"):  # the same field models as an inline side
        for key in set(spec["properties"]) - {"url"}:
            assert sides[side]["properties"][key] == spec["properties"][key]


@pytest.mark.parametrize(("source", "problem", "error"), [
    ({"connectionRef": {"name": "city-nats"}}, None, None),
    ({"connectionRef": {"name": "city-nats"}, "url": "nats://a:4222"}, "url or connectionRef: exactly one",
     r"spec\.source\.connectionRef and spec\.source\.url exclude each other: the NatsConnection \"city-nats\""),
    ({"connectionRef": {"name": "city-nats"}, "tokenSecret": {"name": "t"}}, "connectionRef excludes",
     r"spec\.source\.connectionRef and spec\.source\.tokenSecret exclude each other"),
    ({}, "url or connectionRef: exactly one", r"spec\.source\.url is required \(or spec\.source\.connectionRef"),
])
def test_inline_and_reference_exclude_each_other(source: dict[str, Any], problem: str | None,
                                                 error: str | None) -> None:
    resource = user(source={**source})
    errors = h.cr_errors(resource)
    if problem is None:
        assert errors == []
        parse_spec(resource)
        return
    assert any(problem in e for e in errors), errors
    with pytest.raises(SpecError, match=error):
        parse_spec(resource)


def test_a_connection_takes_one_way_to_authenticate() -> None:
    body = shared(url="nats://a:4222", tokenSecret={"name": "t"}, nkeySecret={"name": "n"})
    with pytest.raises(SpecError, match=r'natsconnection "city-nats": spec\.tokenSecret and spec\.nkeySecret '
                                        "exclude each other: one way to authenticate the connection"):
        parse_connection(body)
    with pytest.raises(SpecError, match=r"spec\.url is required"):
        parse_connection(shared(tokenSecret={"name": "t"}))


def connection_errors(obj: dict[str, Any]) -> list[str]:
    """What the API server would reject of a NatsConnection: its CRD's schema, then its CEL rules."""
    schema = yaml.safe_load(crd.render_connection())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(h._openapi_to_jsonschema(schema))
    errors = [e.message for e in validator.iter_errors(obj)]
    for path, _node, rule in h.cel_rules(schema):
        value = h._at(obj, path)
        if value is not None and not bool(h._cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})):
            errors.append(rule["message"])
    return errors


def test_the_example_connections_are_valid_and_the_crd_refuses_two_ways() -> None:
    examples = h.example_connections()
    assert examples, "examples/shared-connection.yaml"
    for name, spec in examples.items():
        assert connection_errors(shared(name, **spec)) == [], name
        parse_connection(shared(name, **spec))
    assert any("exclude each other" in e for e in connection_errors(
        shared(url="nats://a:4222", tokenSecret={"name": "t"}, nkeySecret={"name": "n"})))
    assert any("'url' is a required property" in e for e in connection_errors(shared(tokenSecret={"name": "t"})))
    assert any("does not match" in e for e in connection_errors(shared(url="http://a:4222")))


# ---- what a reference builds, and the policy on it ----
CITY = {"url": "tls://city.example:4222", "tokenSecret": {"name": "city-token"}, "tlsSecret": "city-tls",
        "tlsKeys": {"ca": "root.pem"}}


def test_a_reference_builds_what_the_inline_fields_build() -> None:
    inline = parse_spec(user(source=CITY) | {"metadata": {"name": "orders", "namespace": NS, "uid": "u"}})
    referenced = resolved(parse_spec(user() | {"metadata": {"name": "orders", "namespace": NS, "uid": "u"}}),
                          {"city-nats": NatsConnectionSpec.model_validate(CITY)})
    assert referenced.source.url == CITY["url"] and referenced.source.connection_ref is not None
    built, expected = build_children(referenced), build_children(inline)
    for kind in (naming.CONFIGMAP, naming.DEPLOYMENT):
        assert h.child_of(built, kind) == h.child_of(expected, kind)
    assert TOKEN not in json.dumps(h.child_of(built, naming.CONFIGMAP))


def test_the_policy_applies_to_a_referenced_connection() -> None:
    spec = resolved(parse_spec(user()), {"city-nats": NatsConnectionSpec.model_validate(CITY)})
    (violation,) = policy.check(spec, policy.Policy(nats_hosts=("*.internal", "127.0.0.0/8")))
    assert violation.reason == policy.HOST_NOT_ALLOWED
    assert violation.message.startswith(
        'natsconnection "city-nats" spec.url (spec.source.connectionRef): host "city.example" is not an allowed')


# ---- the real operator ----
async def test_a_missing_connection_is_stalled_until_it_exists(api: Api, operator: Reconciler) -> None:
    await api.create(user())
    await wait_for(lambda: condition(api, "Degraded").get("reason") == st.CONNECTION_MISSING)
    assert condition(api, "Degraded")["message"] == (
        'natsconnection "city-nats" (spec.source.connectionRef) not found in namespace "conn"')
    assert condition(api, "Stalled")["status"] == "True"
    assert api.get(naming.DEPLOYMENT, NS, "orders") is None and api.get(naming.CONFIGMAP, NS, "orders-config") is None

    # Through the reference, the tenancy policy reads the Secret's label as for an inline one.
    await api.create(h.fake_secret("city-token", NS, {"token": TOKEN.encode()}, usable=False))
    await api.create(shared(url="nats://127.0.0.1:1", tokenSecret={"name": "city-token"}))
    await wait_for(lambda: condition(api, "Degraded").get("reason") == policy.SECRET_NOT_ALLOWED, within=10)
    assert api.get(naming.DEPLOYMENT, NS, "orders") is None

    await api.patch(naming.SECRET, NS, "city-token", {"metadata": {"labels": {policy.USABLE_LABEL: "true"}}})
    deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "orders"), within=10)
    assert h.secret_mounts(deployment) == {f"{naming.SECRETS_DIR}/source-token": "city-token"}
    await wait_for(lambda: condition(api, "Degraded").get("status") == "False")
    text = api.get(naming.CONFIGMAP, NS, "orders-config")["data"][naming.CONFIG_KEY]  # type: ignore[index]
    assert "nats://127.0.0.1:1" in text and TOKEN not in text


async def test_an_edit_reaches_every_user(api: Api, operator: Reconciler) -> None:
    await api.create(h.fake_secret("city-token", NS, {"token": TOKEN.encode()}))
    await api.create(h.fake_secret("city-nkey", NS, {"nkey.seed": Key.create("user").seed}))
    await api.create(shared(url="nats://127.0.0.1:1", tokenSecret={"name": "city-token"}))
    for name in ("orders", "billing"):
        await api.create(user(name))

    def configs() -> list[str]:
        return [str(((api.get(naming.CONFIGMAP, NS, f"{n}-config") or {}).get("data") or {}).get(naming.CONFIG_KEY))
                for n in ("orders", "billing")]

    def pod_annotations(name: str) -> dict[str, Any]:
        deployment = api.get(naming.DEPLOYMENT, NS, name) or {}
        return dict(deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {})

    await wait_for(lambda: all("nats://127.0.0.1:1" in c for c in configs()), within=10)
    before = {n: pod_annotations(n) for n in ("orders", "billing")}

    await api.patch(naming.NATS_CONNECTION, NS, "city-nats", {"spec": {"url": "nats://127.0.0.1:2"}})
    await wait_for(lambda: all("nats://127.0.0.1:2" in c for c in configs()), within=10)
    for name in ("orders", "billing"):  # the config hash moved: the pods roll
        await wait_for(lambda name=name: pod_annotations(name) != before[name], within=10)

    await api.patch(naming.NATS_CONNECTION, NS, "city-nats",
                    {"spec": {"tokenSecret": None, "nkeySecret": {"name": "city-nkey"}}})
    for name in ("orders", "billing"):
        await wait_for(lambda name=name: h.secret_mounts(api.get(naming.DEPLOYMENT, NS, name) or {}) ==
                       {f"{naming.SECRETS_DIR}/source-nkey": "city-nkey"}, within=10)
    assert all("source-nkey/nkey.seed" in c for c in configs())

    running = api.get(naming.DEPLOYMENT, NS, "orders")
    await api.delete(naming.NATS_CONNECTION, NS, "city-nats")  # its users say so; their pods stay as they are
    await wait_for(lambda: condition(api, "Degraded").get("reason") == st.CONNECTION_MISSING, within=10)
    await wait_for(lambda: condition(api, "Degraded", "billing").get("reason") == st.CONNECTION_MISSING, within=10)
    assert condition(api, "Stalled")["status"] == "True"
    kept = api.get(naming.DEPLOYMENT, NS, "orders")
    assert kept is not None and running is not None
    assert kept["spec"] == running["spec"] and kept["metadata"]["resourceVersion"] == \
        running["metadata"]["resourceVersion"]


async def test_the_status_lists_users_and_says_whether_it_connects(api: Api, operator: Reconciler) -> None:
    await api.create(h.fake_secret("city-token", NS, {"token": TOKEN.encode()}))
    await api.create(h.fake_secret("wrong-token", NS, {"token": b"not-the-token-x7"}))
    with LocalNatsServer(name="token-server", extra_config=f'authorization {{ token: "{TOKEN}" }}') as server:
        await api.create(shared(url=server.url, tokenSecret={"name": "city-token"}))
        await api.create(shared("wrong", url=server.url, tokenSecret={"name": "wrong-token"}))
        await api.create(shared("down", url=f"nats://127.0.0.1:{free_port()}"))
        await api.create(shared("no-secret", url=server.url, tokenSecret={"name": "absent"}))
        for name, target in (("orders", "down"), ("billing", None)):
            await api.create(user(name, **({"connectionRef": {"name": target}} if target else {})))

        await wait_for(lambda: connected(api).get("status") == "True", within=15)
        assert connected(api)["reason"] == "Reachable"
        assert connected(api)["message"].startswith(f"signed in to {server.url} (server ")
        await wait_for(lambda: (api.get(naming.NATS_CONNECTION, NS, "city-nats") or {})["status"].get("users") ==
                       ["billing", "orders"], within=15)
        await wait_for(lambda: connected(api, "down").get("status") == "False", within=15)
        assert connected(api, "down")["reason"] == "Unreachable"
        assert "cannot connect to nats://127.0.0.1:" in connected(api, "down")["message"]
        await wait_for(lambda: ((api.get(naming.NATS_CONNECTION, NS, "down") or {}).get("status") or {})
                       .get("users") == ["orders"], within=15)
        await wait_for(lambda: connected(api, "wrong").get("status") == "False", within=15)
        assert connected(api, "wrong")["reason"] == "Unreachable"
        assert "not-the-token-x7" not in connected(api, "wrong")["message"]
        await wait_for(lambda: connected(api, "no-secret").get("reason") == "SecretsUnusable", within=15)
        assert connected(api, "no-secret")["message"] == 'secret "absent" not found in namespace "conn"'

        await api.delete(naming.STREAM_REPLICATION, NS, "billing")  # a user goes: the list follows
        await wait_for(lambda: (api.get(naming.NATS_CONNECTION, NS, "city-nats") or {})["status"].get("users") ==
                       ["orders"], within=15)
    for name in ("city-nats", "wrong", "down", "no-secret"):
        shown = json.dumps(api.get(naming.NATS_CONNECTION, NS, name))
        assert TOKEN not in shown and "not-the-token-x7" not in shown


async def test_the_host_rule_holds_for_a_connection_and_its_check(api: Api, cluster: ClusterEmulator) -> None:
    """A policy that allows only `*.internal` refuses the resource that names a loopback connection, and
    the operator's own check of that connection does not connect either."""
    config = dataclasses.replace(FAST, allowed_nats_hosts=("*.internal",))
    async with embedded_operator(str(cluster.url), config=config):
        await api.create(shared(url="nats://127.0.0.1:1"))
        await api.create(user(url="nats://central.internal:4222"))
        await wait_for(lambda: condition(api, "Degraded").get("reason") == policy.HOST_NOT_ALLOWED, within=10)
        assert condition(api, "Degraded")["message"].startswith(
            'natsconnection "city-nats" spec.url (spec.source.connectionRef): host "127.0.0.1" is not an allowed')
        assert api.get(naming.CONFIGMAP, NS, "orders-config") is None
        await wait_for(lambda: connected(api).get("reason") == policy.HOST_NOT_ALLOWED, within=10)
        assert connected(api)["status"] == "False"
