"""`tokenSecret` and `nkeySecret`: token and bare-nkey authentication with no secret in a URL. The
operator (embedded, against the API emulator) builds the worker from a resource whose source needs
a token or an nkey; the Deployment's container runs as a local process with the Secret's files
mounted, and copies between real nats-servers; neither the token nor the seed is in the ConfigMap,
the Deployment or a URL, and the operator's own status connection signs in with them too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from replication_operator.build.children import build_children
from replication_operator.build.spark_application import NKEY_DIR, TOKEN_DIR
from replication_operator.model import naming
from replication_operator.model.spec import SpecError, parse_spec
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_e2e import NS, _resource, _run_pods
from tests.support.kube_emulator import wait_for
from tests.support.nats_jwt import Key

TOKEN = "tk-op-s3cr3t-91Zq"


def _case(kind: str) -> tuple[str, dict[str, Any], dict[str, bytes], dict[str, Any], str]:
    """(server config, the source's secret ref, the Secret's data, the test client's options, the secret)."""
    if kind == "token":
        return (f'authorization {{ token: "{TOKEN}" }}', {"tokenSecret": {"name": "source-auth"}},
                {"token": f"{TOKEN}\n".encode()}, {"token": TOKEN}, TOKEN)
    user = Key.create("user")
    seed = user.seed.decode()
    return (f'authorization {{ users = [ {{ nkey: "{user.public}" }} ] }}',
            {"nkeySecret": {"name": "source-auth", "key": "user.nk"}}, {"user.nk": user.seed},
            {"nkeys_seed_str": seed}, seed)


@pytest.mark.parametrize("kind", ["token", "nkey"])
async def test_the_worker_and_the_operator_sign_in_with_the_secret(
    api: Api, operator: Reconciler, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client, kind: str
) -> None:
    server_config, ref, data, client_options, secret = _case(kind)
    name = f"cmdb-{kind}"
    with LocalNatsServer(name=f"{kind}-source", extra_config=server_config) as source:
        await api.create(h.fake_secret("source-auth", NS, data))
        resource = _resource(name, source.url, target_server.url)
        resource["spec"]["source"].update(ref)
        await api.create(resource)
        source_nc = await nats.connect(source.url, **client_options)
        try:
            await _run_pods(api, name, 1, tmp_path, source_nc.jetstream(), target_nc, f"e2e_{name}", True)

            async def lag_read() -> bool:  # the operator's own connection reached the source's consumer
                status = (api.get(naming.STREAM_REPLICATION, NS, name) or {}).get("status") or {}
                return status.get("lag") == 0

            await wait_for(lag_read, within=20, interval=0.2)
        finally:
            await source_nc.close()
        configmap = api.get(naming.CONFIGMAP, NS, f"{name}-config")
        deployment = api.get(naming.DEPLOYMENT, NS, name)
        shown = json.dumps([configmap, deployment, api.get(naming.STREAM_REPLICATION, NS, name)])
        assert secret not in shown
        assert source.url in shown  # the URL as written, with nothing added to it
        key = ref[next(iter(ref))].get("key", "token")
        assert f"source-{kind}/{key}" in configmap["data"][naming.CONFIG_KEY]  # a path, not the value


def test_one_way_to_authenticate_a_side() -> None:
    resource = h.example("orders-dc2")
    resource["spec"]["source"].pop("basicAuthSecret", None)
    resource["spec"]["source"].pop("credentialsSecret", None)
    resource["spec"]["source"]["tokenSecret"] = {"name": "a"}
    resource["spec"]["source"]["nkeySecret"] = {"name": "b"}
    assert any("exclude each other" in e for e in h.cr_errors(resource))
    with pytest.raises(SpecError, match=r"tokenSecret and spec\.source\.nkeySecret exclude each other"):
        build_children(parse_spec(resource))


def test_the_fleet_health_job_mounts_an_nkey_seed_or_a_token() -> None:
    resource = h.example("registrations-region", NS)
    target = resource["spec"]["target"]
    target.pop("credentialsSecret")
    target["nkeySecret"] = {"name": "central-nkey"}
    app = h.child_of(build_children(parse_spec(resource)), naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    driver = app["spec"]["template"]["driver"]
    assert {"name": "central-nkey", "path": NKEY_DIR, "secretType": "Generic"} in driver["secrets"]
    args = app["spec"]["template"]["arguments"]
    assert args[args.index("--nkey-seed") + 1] == f"{NKEY_DIR}/nkey.seed"
    target.pop("nkeySecret")
    target["tokenSecret"] = {"name": "central-token"}
    app = h.child_of(build_children(parse_spec(resource)), naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    template = app["spec"]["template"]
    for pod in (template["driver"], template["executor"]):  # every process reads the file at each connect
        assert {"name": "central-token", "path": TOKEN_DIR, "secretType": "Generic"} in pod["secrets"]
    args = template["arguments"]
    assert args[args.index("--token-file") + 1] == f"{TOKEN_DIR}/token"
    assert "central-token" not in args[args.index("--url") + 1]
