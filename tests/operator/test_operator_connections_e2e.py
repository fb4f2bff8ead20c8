"""A StreamReplication whose source and target name NatsConnections, through the real operator process
(the console script against the API emulator) and real nats-servers that demand a token (source) and a
user and password or an nkey (target): the Deployment's container, run here with the Secrets' files,
copies; the operator's own connections sign in through the references; an edit of a connection reaches
the ConfigMap; and no credential is in any object the emulator ever held, a URL, the operator's log
or the worker's log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import kmock
import nats
import pytest
from replication_operator.model import naming

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_e2e import NS, _run_pods
from tests.operator.test_operator_main import SCRIPT, _kubeconfig, _start
from tests.support.kube_emulator import ClusterEmulator, wait_for
from tests.support.nats_jwt import Key

TOKEN = "tk-city-8Hq2-never-shown"
USER, PASSWORD = "replicator", "pw-central-4Kd9-never-shown"
NAME = "cmdb-shared"


def _connection(name: str, url: str, **auth: Any) -> dict[str, Any]:
    return {"apiVersion": naming.API_VERSION, "kind": naming.CONNECTION_KIND,
            "metadata": {"name": name, "namespace": NS}, "spec": {"url": url, **auth}}


def connected(api: Api, name: str) -> dict[str, Any]:
    status = (api.get(naming.NATS_CONNECTION, NS, name) or {}).get("status") or {}
    return next((dict(c) for c in status.get("conditions") or [] if c["type"] == "Connected"), {})


def _everything(cluster: ClusterEmulator) -> str:
    """Every version of every object the emulator held, Secrets apart (they hold the values, encoded)."""
    texts = []
    for key, obj in cluster.objects.items():
        if "secrets" in str(key):
            continue
        for version in getattr(obj, "history", [obj]):
            texts.append(json.dumps(version, default=str))
    return "\n".join(texts)


def _target(kind: str) -> tuple[str, dict[str, bytes], dict[str, Any], dict[str, Any], str, str]:
    """(server config, the Secret's data, the connection's auth field, the test client's options, the
    secret, the mounted file's config path) for a target that wants a user and password, or an nkey."""
    if kind == "basic":
        return (f'authorization {{ users = [ {{ user: "{USER}", password: "{PASSWORD}" }} ] }}',
                {"username": USER.encode(), "password": PASSWORD.encode()},
                {"basicAuthSecret": {"name": "central-login"}}, {"user": USER, "password": PASSWORD}, PASSWORD,
                "target-basic-auth/password")
    key = Key.create("user")
    return (f'authorization {{ users = [ {{ nkey: "{key.public}" }} ] }}', {"nkey.seed": key.seed},
            {"nkeySecret": {"name": "central-login"}}, {"nkeys_seed_str": key.seed.decode()}, key.seed.decode(),
            "target-nkey/nkey.seed")


@pytest.mark.parametrize("kind", ["basic", "nkey"])
async def test_a_shared_connection_copies_and_its_secrets_stay_in_their_secrets(tmp_path: Path, kind: str) -> None:
    source_auth = f'authorization {{ token: "{TOKEN}" }}'
    target_auth, target_data, target_ref, target_options, target_secret, target_file = _target(kind)
    with LocalNatsServer(name="city", extra_config=source_auth) as source, \
            LocalNatsServer(name="central", extra_config=target_auth) as target:
        async with ClusterEmulator() as cluster, kmock.Server(cluster):
            api = Api(cluster)
            await api.create(h.fake_secret("city-token", NS, {"token": TOKEN.encode()}))
            await api.create(h.fake_secret("central-login", NS, target_data))
            await api.create(_connection("city", source.url, tokenSecret={"name": "city-token"}))
            await api.create(_connection("central", target.url, **target_ref))
            env = dict(os.environ, KUBECONFIG=str(_kubeconfig(tmp_path / "kubeconfig", str(cluster.url))),
                       STREAM_REPLICATOR_STATUS_INTERVAL="0.5")
            log = tmp_path / "operator.log"
            proc = _start([SCRIPT, "--all-namespaces", "--standalone", "--liveness", ""], env, log)
            source_nc = await nats.connect(source.url, token=TOKEN)
            target_nc = await nats.connect(target.url, **target_options)
            try:
                await api.create({
                    "apiVersion": naming.API_VERSION, "kind": naming.KIND, "metadata": {"name": NAME, "namespace": NS},
                    "spec": {"engine": "replicator", "topic": "acme.cmdb.>",
                             "source": {"connectionRef": {"name": "city"}, "stream": "CMDB"},
                             "target": {"connectionRef": {"name": "central"}, "stream": "CMDB_COPY"}}})
                await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, NAME), within=30, interval=0.1)
                await _run_pods(api, NAME, 1, tmp_path, source_nc.jetstream(), target_nc, f"e2e_{NAME}", True)

                def status() -> dict[str, Any]:
                    return dict((api.get(naming.STREAM_REPLICATION, NS, NAME) or {}).get("status") or {})

                await wait_for(lambda: status().get("lag") == 0, within=20, interval=0.2)  # the operator signed in
                for name in ("city", "central"):
                    await wait_for(lambda name=name: connected(api, name).get("status") == "True", within=20)
                    shown = (api.get(naming.NATS_CONNECTION, NS, name) or {})["status"]
                    assert shown["users"] == [NAME]

                configmap = api.get(naming.CONFIGMAP, NS, f"{NAME}-config")
                assert configmap is not None
                text = configmap["data"][naming.CONFIG_KEY]
                assert f"source_url: {source.url}" in text and f"target_url: {target.url}" in text  # no userinfo
                assert "source-token/token" in text and target_file in text  # paths, not values
                assert "@" not in text

                # An edit of a connection reaches the user's ConfigMap (and so its pods).
                moved = source.url.replace("127.0.0.1", "localhost")
                await api.patch(naming.NATS_CONNECTION, NS, "city", {"spec": {"url": moved}})
                await wait_for(lambda: f"source_url: {moved}" in str(
                    (api.get(naming.CONFIGMAP, NS, f"{NAME}-config") or {}).get("data")), within=20, interval=0.1)
            finally:
                await source_nc.close()
                await target_nc.close()
                proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(proc.wait, 20)
            assert code == 0, log.read_text()[-2000:]
            seen = {"the emulator's objects": _everything(cluster), "the operator's log": log.read_text(),
                    "the worker's log": (tmp_path / "pod0.log").read_text()}
            assert NAME in seen["the emulator's objects"] and seen["the operator's log"]
            for where, text in seen.items():
                for secret in (TOKEN, target_secret):
                    assert secret not in text, f"a credential in {where}"
