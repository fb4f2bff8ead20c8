"""`tlsKeys`: a TLS Secret whose key names are not cert-manager's (`ca.crt`, `tls.crt`, `tls.key`).
The worker, the operator's own connection and the fleet-health job read the named keys; a Secret
that lacks one is reported under its own name."""

from __future__ import annotations

from pathlib import Path

import nats
from nats.aio.client import Client
from replication_operator.build.children import build_children
from replication_operator.build.spark_application import CA_DIR, TLS_DIR
from replication_operator.checks.secrets import need_problems, secret_needs
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec
from replication_operator.nats import connection
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_e2e import NS, _resource, _run_pods
from tests.support import certs
from tests.support.kube_emulator import wait_for

KEYS = {"ca": "trust-bundle.pem", "cert": "client.pem", "key": "client-key.pem"}


async def test_the_worker_and_the_operator_read_the_named_keys(
    api: Api, operator: Reconciler, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client
) -> None:
    """A source that demands client certificates, from a Secret with other key names."""
    ca = certs.CertificateAuthority.create()
    server_files = certs.write_server(ca, tmp_path / "server", "nats")
    client = ca.issue("replicator", client=True)
    material = {KEYS["ca"]: certs.cert_pem(ca.cert), KEYS["cert"]: certs.cert_pem(client.cert),
                KEYS["key"]: certs.key_pem(client.key)}
    with LocalNatsServer(name="tls-source", extra_config=certs.server_tls_block(server_files), scheme="tls") as source:
        await api.create(h.fake_secret("source-tls", NS, material))
        resource = _resource("cmdb-tls-keys", source.url, target_server.url)
        resource["spec"]["source"]["tlsSecret"] = "source-tls"
        resource["spec"]["source"]["tlsKeys"] = KEYS
        assert h.cr_errors(resource) == []
        await api.create(resource)
        auth = connection.Auth(ca=material[KEYS["ca"]], cert=material[KEYS["cert"]], key=material[KEYS["key"]])
        source_nc = await nats.connect(source.url, tls=auth.material().ssl_context)
        try:
            await _run_pods(api, "cmdb-tls-keys", 1, tmp_path, source_nc.jetstream(), target_nc,
                            "e2e_cmdb-tls-keys", True)

            async def lag_read() -> bool:  # the operator's own TLS connection reached the source
                status = (api.get(naming.STREAM_REPLICATION, NS, "cmdb-tls-keys") or {}).get("status") or {}
                return status.get("lag") == 0

            await wait_for(lag_read, within=20, interval=0.2)
        finally:
            await source_nc.close()
        config = api.get(naming.CONFIGMAP, NS, "cmdb-tls-keys-config")["data"][naming.CONFIG_KEY]
        assert all(f"source-tls/{name}" in config for name in KEYS.values())
        status = api.get(naming.STREAM_REPLICATION, NS, "cmdb-tls-keys")["status"]
        assert KEYS["cert"] in str(status), status  # the certificate expiry watch reads the named key too


def test_a_missing_named_key_is_reported_by_its_name() -> None:
    resource = _resource("cmdb-tls-keys", "tls://nats.example.net:4222", "nats://t.example.net:4222")
    resource["spec"]["source"]["tlsSecret"] = "source-tls"
    resource["spec"]["source"]["tlsKeys"] = KEYS
    needs = secret_needs(parse_spec(resource))
    (problem,) = need_problems(needs, {"source-tls": frozenset({KEYS["cert"]})}, {}, NS)
    assert f'key "{KEYS["key"]}"' in problem.message


def test_the_fleet_health_job_reads_the_named_keys() -> None:
    resource = h.example("registrations-region", NS)
    target = resource["spec"]["target"]
    target["tlsSecret"] = "central-tls"
    target["tlsKeys"] = KEYS
    app = h.child_of(build_children(parse_spec(resource)), naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    args = app["spec"]["template"]["arguments"]
    for flag, role in (("--tls-ca", "ca"), ("--tls-cert", "cert"), ("--tls-key", "key")):
        assert args[args.index(flag) + 1] == f"{TLS_DIR}/{KEYS[role]}"


async def test_the_ca_comes_from_a_trust_manager_config_map(
    api: Api, operator: Reconciler, tmp_path: Path, target_server: LocalNatsServer, target_nc: Client
) -> None:
    """The CA bundle from a ConfigMap (as trust-manager writes one), the client pair from a Secret
    without any CA: the workers and the operator's own connection verify the server with it."""
    ca = certs.CertificateAuthority.create()
    server_files = certs.write_server(ca, tmp_path / "server", "nats")
    client = ca.issue("replicator", client=True)
    pair = {KEYS["cert"]: certs.cert_pem(client.cert), KEYS["key"]: certs.key_pem(client.key)}
    bundle = certs.cert_pem(ca.cert).decode()
    with LocalNatsServer(name="tls-source", extra_config=certs.server_tls_block(server_files), scheme="tls") as source:
        await api.create(h.fake_secret("source-pair", NS, pair))
        await api.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "nats-ca-bundle", "namespace": NS},
                          "data": {"trust-bundle.pem": bundle}})
        resource = _resource("cmdb-ca-map", source.url, target_server.url)
        resource["spec"]["source"].update({
            "tlsSecret": "source-pair", "tlsKeys": {"cert": KEYS["cert"], "key": KEYS["key"]},
            "caConfigMap": {"name": "nats-ca-bundle", "key": "trust-bundle.pem"}})
        assert h.cr_errors(resource) == []
        await api.create(resource)
        auth = connection.Auth(ca=bundle.encode(), cert=pair[KEYS["cert"]], key=pair[KEYS["key"]])
        source_nc = await nats.connect(source.url, tls=auth.material().ssl_context)
        try:
            await _run_pods(api, "cmdb-ca-map", 1, tmp_path, source_nc.jetstream(), target_nc,
                            "e2e_cmdb-ca-map", True)

            async def lag_read() -> bool:  # the operator verified the server with the ConfigMap's CA
                status = (api.get(naming.STREAM_REPLICATION, NS, "cmdb-ca-map") or {}).get("status") or {}
                return status.get("lag") == 0

            await wait_for(lag_read, within=20, interval=0.2)
        finally:
            await source_nc.close()
        deployment = api.get(naming.DEPLOYMENT, NS, "cmdb-ca-map")
        h.validate_k8s(deployment)
        assert h.config_map_mounts(deployment) == {"/var/run/secrets/stream-replicator/source-ca": "nats-ca-bundle"}
        config = api.get(naming.CONFIGMAP, NS, "cmdb-ca-map-config")["data"][naming.CONFIG_KEY]
        assert "source-ca/trust-bundle.pem" in config
        spec = parse_spec(api.get(naming.STREAM_REPLICATION, NS, "cmdb-ca-map") or {})
        problems, _, held = await operator.secrets.check(spec)
        assert problems == []
        assert 'configmap "nats-ca-bundle" key "trust-bundle.pem"' in [c.where for c in held]  # the expiry watch


def test_the_ca_config_map_reaches_the_deployment_and_the_fleet_health_job() -> None:
    resource = _resource("cmdb-ca-map", "tls://nats.example.net:4222", "nats://t.example.net:4222")
    resource["spec"]["source"]["caConfigMap"] = {"name": "nats-ca-bundle"}
    children = build_children(parse_spec(resource))
    fleet = h.example("registrations-region", NS)
    fleet["spec"]["target"]["caConfigMap"] = {"name": "nats-ca-bundle", "key": "trust-bundle.pem"}
    app = h.child_of(build_children(parse_spec(fleet)), naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    args = app["spec"]["template"]["arguments"]
    assert args[args.index("--tls-ca") + 1] == f"{CA_DIR}/trust-bundle.pem"
    assert app["spec"]["template"]["driver"]["configMaps"] == [{"name": "nats-ca-bundle", "path": CA_DIR}]
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    h.validate_k8s(deployment)


async def test_a_missing_ca_config_map_or_key_is_reported(api: Api, operator: Reconciler) -> None:
    resource = _resource("cmdb-ca-missing", "tls://nats.example.net:4222", "nats://t.example.net:4222")
    resource["spec"]["source"]["caConfigMap"] = {"name": "nats-ca-bundle", "key": "trust-bundle.pem"}
    spec = parse_spec(resource)
    problems, _, _ = await operator.secrets.check(spec)
    assert [(p.reason, p.message) for p in problems] == [
        ("SecretMissing", f'configmap "nats-ca-bundle" (key "trust-bundle.pem") not found in namespace "{NS}"')]
    await api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nats-ca-bundle", "namespace": NS},
                      "data": {"ca.crt": "x"}})
    problems, _, _ = await operator.secrets.check(spec)
    assert [p.reason for p in problems] == ["SecretKeyMissing"]
