"""`basicAuthSecret` through the real operator (kopf against the API emulator) and real nats-servers
that require a user and password: the Secret mounted and the password nowhere in the ConfigMap, the
Deployment, the status or the events; the exclusive-field error; a missing Secret or key as an
honest condition; the status probe signing in with the Secret; the worker pod copying with it;
and a Warning for a password left in a URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec
from replication_operator.nats import connection, probes
from replication_operator.nats.connection import NatsStatusError
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_e2e import _run_pods
from tests.operator.test_operator_nats import _consumer_with_backlog
from tests.support.kube_emulator import wait_for

NS = "e2e"  # the namespace `_run_pods` expects
USER, PASSWORD = "replicator", "pw-7vQ-from-a-secret"
LOGIN = {"username": USER.encode(), "password": PASSWORD.encode()}


def _resource(name: str = "orders", source_url: str = "nats://127.0.0.1:1", target_url: str = "nats://127.0.0.1:1",
              **source: Any) -> dict[str, Any]:
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"engine": "replicator", "topic": "acme.cmdb.>",
                 "source": {"url": source_url, "stream": "CMDB", **source},
                 "target": {"url": target_url, "stream": "CMDB_COPY"}},
    }


def _users(*users: tuple[str, str]) -> str:
    entries = ", ".join(f'{{ user: "{u}", password: "{p}" }}' for u, p in users)
    return f"authorization {{ users = [ {entries} ] }}"


def _condition(api: Api, kind: str, name: str = "orders") -> dict[str, Any]:
    obj = api.get(naming.STREAM_REPLICATION, NS, name) or {}
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def _no_password_anywhere(api: Api, name: str = "orders") -> None:
    for obj in (api.get(naming.CONFIGMAP, NS, f"{name}-config"), api.get(naming.DEPLOYMENT, NS, name),
                api.get(naming.STREAM_REPLICATION, NS, name)):
        assert PASSWORD not in json.dumps(obj), "the password leaked into an object"
    for event in api.events(NS, name):
        assert PASSWORD not in json.dumps(event), "the password leaked into an event"


async def test_the_secret_is_mounted_and_the_password_stays_in_it(api: Api, operator: Reconciler) -> None:
    await api.create(h.fake_secret("orders-login", NS, LOGIN))
    await api.create(_resource(basicAuthSecret={"name": "orders-login"}))
    deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "orders"))
    configmap = api.get(naming.CONFIGMAP, NS, "orders-config")
    assert configmap is not None
    text = configmap["data"][naming.CONFIG_KEY]
    assert "source_user_file: /var/run/secrets/stream-replicator/source-basic-auth/username" in text
    assert "source_password_file: /var/run/secrets/stream-replicator/source-basic-auth/password" in text
    assert h.secret_mounts(deployment) == {f"{naming.SECRETS_DIR}/source-basic-auth": "orders-login"}
    _no_password_anywhere(api)


async def test_missing_secret_then_missing_key_then_recovered(api: Api, operator: Reconciler) -> None:
    await api.create(_resource(basicAuthSecret={"name": "orders-login", "passwordKey": "secret"}))
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "SecretMissing")
    assert _condition(api, "Degraded")["message"] == (
        'secret "orders-login" (keys "username", "secret") not found in namespace "e2e"')
    assert api.get(naming.DEPLOYMENT, NS, "orders") is None

    await api.create(h.fake_secret("orders-login", NS, LOGIN))  # `password`, not the `secret` asked for
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "SecretKeyMissing")
    assert _condition(api, "Degraded")["message"] == 'secret "orders-login" has no key "secret" in namespace "e2e"'

    fixed = h.fake_secret("x", NS, {**LOGIN, "secret": PASSWORD.encode()})["data"]
    await api.patch(naming.SECRET, NS, "orders-login", {"data": fixed})
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "orders"), within=5)
    await wait_for(lambda: _condition(api, "Degraded").get("status") == "False")
    await wait_for(lambda: "Recovered" in api.reasons(NS, "orders"))
    _no_password_anywhere(api)


async def test_an_unlabelled_secret_is_not_used(api: Api, operator: Reconciler) -> None:
    """The tenancy policy covers basicAuthSecret like every Secret a resource names."""
    await api.create(h.fake_secret("orders-login", NS, LOGIN, usable=False))
    await api.create(_resource(basicAuthSecret={"name": "orders-login"}))
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "SecretNotAllowed")
    assert 'secret "orders-login"' in _condition(api, "Degraded")["message"]
    assert api.get(naming.DEPLOYMENT, NS, "orders") is None
    _no_password_anywhere(api)


async def test_both_secrets_on_one_side_is_an_invalid_spec(api: Api, operator: Reconciler) -> None:
    """The API server's CEL rule refuses it; an object that got past it builds nothing."""
    await api.create(h.fake_secret("orders-login", NS, LOGIN))
    await api.create(_resource(basicAuthSecret={"name": "orders-login"}, credentialsSecret={"name": "orders-login"}))
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "InvalidSpec")
    assert _condition(api, "Degraded")["message"] == (
        "spec.source.credentialsSecret and spec.source.basicAuthSecret exclude each other: one way to "
        "authenticate the source")
    assert api.get(naming.CONFIGMAP, NS, "orders-config") is None


async def test_a_password_in_the_url_still_works_with_a_warning(api: Api, operator: Reconciler) -> None:
    await api.create(_resource(source_url=f"nats://{USER}:{PASSWORD}@127.0.0.1:1"))
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "orders"))
    await wait_for(lambda: "PasswordInURL" in api.reasons(NS, "orders"))
    (event,) = [e for e in api.events(NS, "orders") if e.get("reason") == "PasswordInURL"]
    assert event["type"] == "Warning"
    assert "spec.source.url carries a user and password (nats://***@127.0.0.1:1)" in event["message"]
    assert "spec.source.basicAuthSecret" in event["message"] and PASSWORD not in event["message"]
    await wait_for(lambda: _condition(api, "Degraded").get("status") == "False")  # advice blocks nothing
    await api.patch(naming.STREAM_REPLICATION, NS, "orders", {"spec": {"replicas": 2}})  # another pass
    await wait_for(lambda: api.get(naming.PDB, NS, "orders"))
    assert api.reasons(NS, "orders").count("PasswordInURL") == 1, "the same advice is given once"


async def test_the_status_probe_signs_in_with_the_secret(
    api: Api, operator: Reconciler, tmp_path: Path
) -> None:
    """The operator reads lag from a source that requires a user and password, with the values of
    the Secret (read through the API for every refresh); a wrong one is an error without it."""
    admin = ("admin", "admin-pw")
    with LocalNatsServer(name="basic-source", extra_config=_users((USER, PASSWORD), admin)) as source:
        nc = await nats.connect(source.url, user=admin[0], password=admin[1])
        try:
            await _consumer_with_backlog(nc, "e2e_orders", published=5, acked=2)
        finally:
            await nc.close()
        spec = parse_spec(_resource(source_url=source.url, basicAuthSecret={"name": "orders-login"}))
        auth = connection.auth_from_secrets(spec.source, {"orders-login": LOGIN})
        assert (await probes.read_consumer(spec, auth, 5))["lag"] == 3
        wrong = connection.auth_from_secrets(spec.source, {"orders-login": {**LOGIN, "password": b"nope-x1"}})
        with pytest.raises(NatsStatusError, match="cannot connect") as err:
            await probes.read_consumer(spec, wrong, 5)
        assert "nope-x1" not in str(err.value)

        await api.create(h.fake_secret("orders-login", NS, LOGIN))
        await api.create(_resource(source_url=source.url, basicAuthSecret={"name": "orders-login"}))
        status = lambda: (api.get(naming.STREAM_REPLICATION, NS, "orders") or {}).get("status") or {}  # noqa: E731
        await wait_for(lambda: status().get("lag") == 3, within=5)
        _no_password_anywhere(api)


async def test_the_worker_pod_copies_with_the_mounted_secret(
    api: Api, operator: Reconciler, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client
) -> None:
    """What the Deployment runs, with the Secret's files where the pod has them, copies from a
    source that accepts only that user and password."""
    with LocalNatsServer(name="basic-source", extra_config=_users((USER, PASSWORD))) as source:
        await api.create(h.fake_secret("orders-login", NS, LOGIN))
        await api.create(_resource("cmdb-basic", source.url, target_server.url,
                                   basicAuthSecret={"name": "orders-login"}))
        source_nc = await nats.connect(source.url, user=USER, password=PASSWORD)
        try:
            await _run_pods(api, "cmdb-basic", 1, tmp_path, source_nc.jetstream(), target_nc, "e2e_cmdb-basic", True)
        finally:
            await source_nc.close()
        assert PASSWORD not in (tmp_path / "pod0.log").read_text()
