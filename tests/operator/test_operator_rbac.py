"""RBAC lists only what is used: the operator's real API calls against the chart's rendered rules.

The real operator (kopf + handlers, `embedded_operator`) runs through a StreamReplication's whole
life against the API emulator, for both engines (a native-engine resource against real servers
joined by a leafnode, switched to the replicator and back), which records every call by caller as
an RBAC (verb, group, resource, namespaced?). The chart is rendered by the real Helm engine for the
same mode, and the operator is started the way the chart's Deployment starts it (its arguments
parsed by the real CLI parser), with the peering object the chart creates. Then:

(a) every call the operator made is granted by the chart (and by `expected_rbac`, the contract
    tests/helm checks the chart against): nothing is used without permission;
(b) every verb the chart grants was used in the lifecycle: nothing is granted that is unused
    (a grant the emulator cannot exercise would be listed in `NOT_EXERCISED`, with why: none is).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import kmock
import nats
import pytest
from replication_operator.main import build_parser, operator_config
from replication_operator.model import naming

from replicator.demo.local_nats import LocalNatsServer
from tests.helm.helm_chart_support import expected_rbac, find, one, permissions, rbac_rules, render
from tests.operator import helpers as h
from tests.operator.conftest import FAST
from tests.operator.helpers import Api
from tests.support.kube_emulator import OPERATOR_TOKEN, ApiCall, ClusterEmulator, embedded_operator, wait_for

NS = "replication"
NAME = "registrations-region"  # examples/sampling-fleet-health.yaml: every optional feature on
SECRETS = {"region-eu-nats": "user.creds", "central-nats": "replicator.creds"}

# Chart values for each mode the operator can run in against the emulator.
MODES: dict[str, dict[str, Any]] = {
    # The chart's defaults: --all-namespaces, one ClusterRole, ClusterKopfPeering.
    "cluster-wide": {},
    # --namespace=replication, a Role there plus a read-only ClusterRole, KopfPeering there.
    "namespaced": {"rbac": {"namespaced": True}, "operator": {"namespaces": [NS]}},
    # --all-namespaces --standalone: no peering rights.
    "standalone": {"peering": {"enabled": False}},
    # --namespace=replication --roles-only: a Role there and no ClusterRole at all.
    "roles-only": {"rbac": {"namespaced": True, "rolesOnly": True}, "operator": {"namespaces": [NS]}},
}

# Grants the lifecycle below cannot exercise against the emulator: (group, resource, verb) -> why.
# None at present; the emulator's one stand-in worth knowing: a server-side apply that creates an
# object (PATCH, which a real API server authorizes as patch *and* create) reaches the emulator as a
# PATCH answered 404 and then a POST (kube.KubeApi.apply), so both verbs are observed all the same.
NOT_EXERCISED: dict[tuple[str, str, str], str] = {}

Permissions = dict[tuple[str, str], frozenset[str]]


def _resource() -> dict[str, Any]:
    """The example with every optional feature, NATS URLs that refuse at once."""
    resource = h.example(NAME, NS)
    for key in ("uid", "generation"):
        resource["metadata"].pop(key)
    spec = resource["spec"]
    spec["source"]["url"] = spec["target"]["url"] = "nats://127.0.0.1:1"
    spec["networkPolicy"] = {"enabled": True}
    assert spec["replicas"] > 1 and spec["fleetHealth"] and spec["monitoring"]["serviceMonitor"]["enabled"]
    assert spec["source"]["credentialsSecret"]["name"] in SECRETS
    return resource


def _status(api: Api, name: str = NAME) -> dict[str, Any]:
    return dict((api.get(naming.STREAM_REPLICATION, NS, name) or {}).get("status") or {})


def _condition(api: Api, kind: str, name: str = NAME) -> dict[str, Any]:
    return next((dict(c) for c in _status(api, name).get("conditions") or [] if c["type"] == kind), {})


OPTIONAL = (
    (naming.PDB, naming.pdb_name(NAME)),
    (naming.SERVICE_MONITOR, naming.service_monitor_name(NAME)),
    (naming.NETWORK_POLICY, naming.network_policy_name(NAME)),
    (naming.SCHEDULED_SPARK_APPLICATION, naming.fleet_health_name(NAME)),
)
ALWAYS = (
    (naming.DEPLOYMENT, naming.deployment_name(NAME)),
    (naming.CONFIGMAP, naming.configmap_name(NAME)),
    (naming.SERVICE, naming.service_name(NAME)),
)


async def _lifecycle(api: Api) -> None:
    """Every path on which the operator talks to the API, in the order a user would cause them."""
    # Created before its Secrets: SecretMissing in status and as an event, nothing built.
    await api.create(_resource())
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "SecretMissing")
    await wait_for(lambda: "SecretMissing" in api.reasons(NS, NAME))
    assert api.get(naming.DEPLOYMENT, NS, NAME) is None

    # The Secrets appear, labelled for use (the policy reads the label with the same `get`): the
    # status timer's re-check builds every child, optional ones included.
    for secret, key in SECRETS.items():
        await api.create(h.fake_secret(secret, NS, {key: b"creds"}))
    for kind, name in ALWAYS + OPTIONAL:
        await wait_for(lambda kind=kind, name=name: api.get(kind, NS, name))
    await wait_for(lambda: _condition(api, "Degraded").get("status") == "False")
    await wait_for(lambda: "Recovered" in api.reasons(NS, NAME))

    # A spec change: children updated, pods rolled.
    await api.patch(naming.STREAM_REPLICATION, NS, NAME, {"spec": {"maxAge": "2h"}})
    await wait_for(lambda: _status(api).get("observedGeneration") == 2)
    await wait_for(lambda: any("rolling the pods" in e["message"] for e in api.events(NS, NAME)))

    # An edit the tenancy policy refuses: only the status and an Event are written.
    await api.patch(naming.STREAM_REPLICATION, NS, NAME, {"spec": {"image": "docker.io/someone/miner:1"}})
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "ImageNotAllowed")
    await api.patch(naming.STREAM_REPLICATION, NS, NAME, {"spec": {"image": None}})
    await wait_for(lambda: _condition(api, "Degraded").get("status") == "False")

    # Drift: a deleted child comes back.
    await api.delete(naming.SERVICE, NS, naming.service_name(NAME))
    await wait_for(lambda: "Restored" in api.reasons(NS, NAME))

    # Optional features off: their children are deleted.
    await api.patch(
        naming.STREAM_REPLICATION,
        NS,
        NAME,
        {"spec": {"replicas": 1, "fleetHealth": None, "monitoring": {"serviceMonitor": {"enabled": False}},
                  "networkPolicy": {"enabled": False}}},
    )
    for kind, name in OPTIONAL:
        await wait_for(lambda kind=kind, name=name: api.get(kind, NS, name) is None)

    # Deleted: kopf releases its finalizer.
    await api.delete(naming.STREAM_REPLICATION, NS, NAME)
    await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, NAME) is None)
    await _connection_lifecycle(api)


async def _connection_lifecycle(api: Api) -> None:
    """A shared connection: read by name for its user (missing at first), its status written."""
    user = {"apiVersion": naming.API_VERSION, "kind": naming.KIND, "metadata": {"name": "via-shared", "namespace": NS},
            "spec": {"engine": "replicator", "topic": "rbac.>", "source": {"connectionRef": {"name": "shared"}},
                     "target": {"url": "nats://127.0.0.1:1"}}}
    await api.create(user)
    await wait_for(lambda: _condition(api, "Degraded", "via-shared").get("reason") == "ConnectionMissing")
    await api.create({"apiVersion": naming.API_VERSION, "kind": naming.CONNECTION_KIND,
                      "metadata": {"name": "shared", "namespace": NS}, "spec": {"url": "nats://127.0.0.1:1"}})
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "via-shared"))

    def users() -> list[str]:
        return list(((api.get(naming.NATS_CONNECTION, NS, "shared") or {}).get("status") or {}).get("users") or [])

    await wait_for(lambda: users() == ["via-shared"], within=10)
    await api.delete(naming.STREAM_REPLICATION, NS, "via-shared")
    await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, "via-shared") is None, within=10)


async def _native_lifecycle(api: Api, leaf: LocalNatsServer, hub: LocalNatsServer) -> None:
    """The native engine's calls: a resource NATS copies for (no Deployment), switched to the
    replicator and back (the Deployment created, then deleted in the foreground), then deleted
    (the finalizer removes the source entry)."""
    name = "native-engine"
    body = {
        "apiVersion": naming.API_VERSION, "kind": naming.KIND, "metadata": {"name": name, "namespace": NS},
        "spec": {"topic": "rbac.>", "engine": "native",
                 "source": {"url": leaf.url, "stream": "RBAC", "domain": "leaf"},
                 "target": {"url": hub.url, "stream": "RBAC_HUB", "subjectPrefix": "hub"}},
    }
    await api.create(body)

    def sourcing(generation: int) -> bool:
        ready = _condition(api, "Ready", name)
        return ready.get("reason") == "Sourcing" and ready.get("observedGeneration") == generation

    await wait_for(lambda: sourcing(1), within=15)
    await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"engine": "replicator"}})
    await wait_for(lambda: _condition(api, "Ready", name).get("observedGeneration") == 2, within=15)
    assert api.get(naming.DEPLOYMENT, NS, name) is not None
    await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"engine": "native"}})
    await wait_for(lambda: sourcing(3), within=15)
    assert api.get(naming.DEPLOYMENT, NS, name) is None
    await api.delete(naming.STREAM_REPLICATION, NS, name)
    await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, name) is None, within=15)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNatsServer, LocalNatsServer]]:
    """A source (JetStream domain `leaf`) joined to a target (`hub`) by a leafnode, with the source
    stream the native lifecycle reads."""
    hub = LocalNatsServer(name="hub", store_dir=tmp_path_factory.mktemp("hub"), domain="hub",
                          leafnode_listen=True).start()
    leaf = LocalNatsServer(name="leaf", store_dir=tmp_path_factory.mktemp("leaf"), domain="leaf",
                           leafnode_remote=f"nats://127.0.0.1:{hub.leafnode_port}").start()

    async def prepare() -> None:
        nc = await nats.connect(leaf.url)
        await nc.jetstream().add_stream(name="RBAC", subjects=["rbac.>"])
        await nc.close()
        hub_nc = await nats.connect(hub.url)

        async def linked() -> bool:
            try:
                await hub_nc.request("$JS.leaf.API.INFO", b"", timeout=0.5)
                return True
            except Exception:
                return False

        await wait_for(linked, within=15, interval=0.1)
        await hub_nc.close()

    asyncio.run(prepare())
    yield leaf, hub
    leaf.close()
    hub.close()


async def _post(cluster: ClusterEmulator, path: str, obj: dict[str, Any]) -> None:
    async with cluster.post(path, json=obj) as resp:
        assert resp.status < 300, (resp.status, await resp.text())


def _granted(grants: dict[str, Permissions], call: ApiCall) -> bool:
    """Whether a ClusterRole grants the call, or (namespaced calls only) the served namespace's Role."""
    scopes = ["cluster", NS] if call.namespaced else ["cluster"]
    return any(call.verb in grants.get(scope, {}).get((call.group, call.resource), ()) for scope in scopes)


async def _run(mode: str, sites: tuple[LocalNatsServer, LocalNatsServer]) -> tuple[bool, set[ApiCall],
                                                                                 ClusterEmulator]:
    """(cluster-wide?, the operator's calls, the emulator) after a whole lifecycle, the operator
    started as the chart's Deployment starts it in a mode."""
    objects = render(MODES[mode])
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # The chart's settings (policy included) with the tests' short intervals.
    config = dataclasses.replace(
        operator_config(args, env),
        status_interval=FAST.status_interval, resync_interval=FAST.resync_interval, nats_timeout=FAST.nats_timeout,
    )
    async with ClusterEmulator() as cluster, kmock.Server(cluster):
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        await _post(cluster, "/api/v1/namespaces", namespace)
        # The peering object the chart creates: kopf keeps the operator paused until it sees it.
        for peering in find(objects, "ClusterKopfPeering") + find(objects, "KopfPeering"):
            ns = peering["metadata"].get("namespace")
            plural = f"namespaces/{ns}/kopfpeerings" if ns else "clusterkopfpeerings"
            await _post(cluster, f"/apis/kopf.dev/v1/{plural}", peering)
        async with embedded_operator(
            str(cluster.url),
            namespaces=args.namespaces,
            config=config,
            peering=None if args.standalone else args.peering,
        ):
            await _lifecycle(Api(cluster))
            await _native_lifecycle(Api(cluster), *sites)
        return bool(args.all_namespaces), cluster.calls_of(OPERATOR_TOKEN), cluster


def _table(calls: set[ApiCall]) -> str:
    rows = [f"  {c.verb:<8} {c.group or 'core':<24} {c.resource:<28} {c.namespaced}" for c in sorted(calls)]
    return "\n".join(rows)


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_rbac_grants_exactly_what_the_operator_calls(
    mode: str, sites: tuple[LocalNatsServer, LocalNatsServer]
) -> None:
    clusterwide, calls, cluster = await _run(mode, sites)
    print(f"\n{mode}: the operator's calls (verb, group, resource, namespaced):\n{_table(calls)}")
    assert set(cluster.api_calls) <= {"", OPERATOR_TOKEN}, "a caller the test does not know"
    assert calls, "no calls recorded for the operator"

    # The chart's rules (real Helm engine) are the RBAC contract, scope by scope.
    chart = {scope: permissions(rules) for scope, rules in rbac_rules(MODES[mode]).items()}
    peering = MODES[mode].get("peering", {}).get("enabled", True)
    roles_only = MODES[mode].get("rbac", {}).get("rolesOnly", False)
    expected_cluster, expected_namespaced = expected_rbac(
        clusterwide=clusterwide, peering=peering, roles_only=roles_only)
    contract = (
        {"cluster": expected_cluster, NS: expected_namespaced}  # a Role per served namespace
        if MODES[mode].get("rbac", {}).get("namespaced")
        else {"cluster": {**expected_cluster, **expected_namespaced}}
    )
    if roles_only:
        del contract["cluster"]  # no ClusterRole rendered at all
    assert chart == contract

    # (a) Nothing is used without permission.
    ungranted = sorted(c for c in calls if not _granted(chart, c))
    assert ungranted == [], f"the operator calls these without permission in {mode} mode"
    # Besides resources, only discovery, which every authenticated user may read (system:discovery).
    for method, path in cluster.other_calls.get(OPERATOR_TOKEN, set()):
        assert method == "GET" and re.fullmatch(r"/version|/api(/v1)?|/apis(/[^/]+/[^/]+)?", path), path

    # (b) Nothing is granted that is unused.
    used = {(c.group, c.resource, c.verb) for c in calls}
    unused = sorted(
        (group, resource, verb)
        for grants in chart.values()
        for (group, resource), verbs in grants.items()
        for verb in verbs
        if (group, resource, verb) not in used and (group, resource, verb) not in NOT_EXERCISED
    )
    assert unused == [], f"granted in {mode} mode but never used"
    stale = sorted(k for k in NOT_EXERCISED if k in used)
    assert stale == [], "exercised after all: drop these from NOT_EXERCISED"
