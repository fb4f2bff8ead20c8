"""Run the real operator without a cluster: a kmock API emulator and kopf embedded in one event loop.

Used by the operator tests and `bench/operator_reconcile.py`; needs the `test` extra (kmock).
kmock's KubernetesEmulator stores objects and serves list/watch/patch, but, unlike an API server,
stamps no uid, resourceVersion or generation, has no generateName and no status subresource, and
cannot parse `/api/v1/namespaces`; the subclass below adds those, because kopf and the operator rely
on them. It also records every API call as an RBAC (verb, group, resource) per caller, so that a
test can compare what the operator really calls with what its RBAC grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import itertools
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from typing import Any, NamedTuple

import aiohttp.web
import jsonpatch
import kmock
import kopf
from replication_operator import handlers
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler
from replication_operator.settings import OperatorConfig

ALL_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]

# The bearer token `embedded_operator` logs in with: the emulator files the operator's calls under it.
OPERATOR_TOKEN = "embedded-operator"
NAMESPACES = kmock.resource("", "v1", "namespaces")
FOREGROUND = "foregroundDeletion"  # the finalizer of a foreground deletion


class ApiCall(NamedTuple):
    """One kind of API call, as RBAC sees it: `resource` is "plural" or "plural/subresource";
    `namespaced` is whether the URL named a namespace (a Role there can grant it) or not (only a
    ClusterRole can: cluster-scoped resources, and namespaced ones listed/watched across namespaces)."""

    verb: str
    group: str
    resource: str
    namespaced: bool


def rbac_verb(method: str, name: str | None, params: Mapping[str, str]) -> str:
    """The RBAC verb an API server authorizes an HTTP request as."""
    method = method.upper()
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


# (group/version/plural, kind, namespaced, subresources)
RESOURCES: list[tuple[str, str, bool, set[str]]] = [
    (f"{naming.GROUP}/{naming.VERSION}/{naming.PLURAL}", naming.KIND, True, {"status", "scale"}),
    (f"{naming.GROUP}/{naming.VERSION}/{naming.CONNECTION_PLURAL}", naming.CONNECTION_KIND, True, {"status"}),
    ("v1/configmaps", "ConfigMap", True, set()),
    ("v1/services", "Service", True, {"status"}),
    ("v1/secrets", "Secret", True, set()),
    ("v1/events", "Event", True, set()),
    ("v1/namespaces", "Namespace", False, {"status"}),
    ("apps/v1/deployments", "Deployment", True, {"status", "scale"}),
    ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True, {"status"}),
    ("monitoring.coreos.com/v1/servicemonitors", "ServiceMonitor", True, set()),
    ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", True, set()),
    ("sparkoperator.k8s.io/v1beta2/scheduledsparkapplications", "ScheduledSparkApplication", True,
     {"status"}),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False, {"status"}),
    ("kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering", False, set()),
    ("kopf.dev/v1/kopfpeerings", "KopfPeering", True, set()),
]


def _merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386), as the emulator applies dict patches."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(base) if isinstance(base, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus uid, resourceVersion, generation, creationTimestamp, generateName,
    and the status subresource's isolation (status only via /status, never via the main object)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)
        self._last_version = 0
        self.calls = 0  # API requests served
        self.writes = 0  # of which creates, patches and deletes
        # Every kind of call served, by caller (its bearer token; "" without one): resource calls as
        # RBAC sees them, and the rest (discovery: /api, /apis/<group>/<version>, /version) by path.
        self.api_calls: dict[str, set[ApiCall]] = {}
        self.other_calls: dict[str, set[tuple[str, str]]] = {}
        self._inflight: dict[int, kmock.Request] = {}
        self._with_status: set[tuple[str, str]] = set()
        # A foreground deletion waits for the garbage collector (the object keeps a
        # `foregroundDeletion` finalizer); with no pods here, it finishes at once unless a test
        # plays the kubelet and releases it after stopping the "pods" (`release`).
        self.hold_foreground = False
        for path, kind, namespaced, subresources in RESOURCES:
            self.resources[path] = kmock.ResourceInfo(
                kind=kind,
                singular=kind.lower(),
                namespaced=namespaced,
                verbs=set(ALL_VERBS),
                subresources=subresources,
                shortnames={"srep"} if kind == naming.KIND else set(),
            )
            if "status" in subresources:
                group_version, plural = path.rsplit("/", 1)
                self._with_status.add((group_version, plural))

    def _next_version(self) -> str:
        self._last_version = next(self._versions)
        return str(self._last_version)

    async def _serve_list(self, request: kmock.Request) -> Any:
        """Lists carry the current resourceVersion, so a watch can start right after them."""
        result: Any = await super()._serve_list(request)  # type: ignore[misc]
        result["metadata"]["resourceVersion"] = str(self._last_version)
        return result

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """Like an API server, a watch from resourceVersion N sends no events the list already had.

        kmock replays every object as ADDED on each watch; kopf takes such a stale replay after its
        own patch as a conflict it then never resolves.
        """
        since = request.params.get("resourceVersion", "")
        async for event in super()._serve_watch(request):  # type: ignore[misc]
            if since.isdigit() and isinstance(event, dict) and event.get("type") in ("ADDED", "MODIFIED"):
                version = str((event.get("object") or {}).get("metadata", {}).get("resourceVersion", ""))
                if version.isdigit() and int(version) <= int(since):
                    continue
            yield event

    def _has_status(self, resource: kmock.resource) -> bool:
        gv = f"{resource.group}/{resource.version}" if resource.group else str(resource.version)
        return (gv, str(resource.plural)) in self._with_status

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's path parser takes `/api/v1/namespaces` for a namespaced path that lacks its plural
        and fails; kopf lists and watches it when it serves chosen namespaces: parse it here."""
        if raw_request.path.rstrip("/") != "/api/v1/namespaces":
            return await super().__call__(raw_request)
        body = await raw_request.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        query = dict(raw_request.query)
        actions = {
            "GET": kmock.action.WATCH if query.get("watch") == "true" else kmock.action.LIST,
            "POST": kmock.action.CREATE,
        }
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=query,
            headers=dict(raw_request.headers),
            body=body,
            text=body.decode(errors="replace"),
            data=data,
            action=actions.get(raw_request.method),
            resource=NAMESPACES,
        )
        self._requests.append(request)
        return await self._handle(request)

    def _record(self, request: kmock.Request) -> None:
        auth = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        caller = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        resource = request.resource
        if resource is None or not resource.plural:
            self.other_calls.setdefault(caller, set()).add((request.method.value, request.url.path))
            return
        plural = f"{resource.plural}/{request.subresource}" if request.subresource else str(resource.plural)
        verb = rbac_verb(request.method.value, request.name, request.params)
        call = ApiCall(verb, str(resource.group or ""), plural, request.namespace is not None)
        self.api_calls.setdefault(caller, set()).add(call)

    def calls_of(self, caller: str = OPERATOR_TOKEN) -> set[ApiCall]:
        """The kinds of call made with a bearer token (by default: the embedded operator's)."""
        return set(self.api_calls.get(caller, ()))

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        self.calls += 1
        self._record(request)
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE):
            self.writes += 1
        # kmock matches every request against its reactions by scanning the whole request history,
        # which makes thousands of requests quadratic: keep only the requests still being served.
        self._inflight[id(request)] = request
        self._requests[:] = [r for r in self._requests if id(r) in self._inflight]
        try:
            if (self.hold_foreground and request.action == kmock.action.DELETE and request.name
                    and isinstance(request.data, dict) and request.data.get("propagationPolicy") == "Foreground"):
                self._hold(request)
            if request.resource is not None and isinstance(request.data, dict | list):
                if request.action == kmock.action.CREATE and isinstance(request.data, dict):
                    self._stamp_create(request)
                elif request.action == kmock.action.UPDATE and request.name is not None:
                    self._stamp_update(request)
            return await super()._handle(request)
        finally:
            self._inflight.pop(id(request), None)

    def _hold(self, request: kmock.Request) -> None:
        key: Any = (request.resource, request.namespace, request.name)
        if key in self.objects and not self.objects[key].deleted:
            finalizers = list(self.objects[key].get("metadata", {}).get("finalizers") or [])
            if FOREGROUND not in finalizers:
                self.objects[key].patch({"metadata": {"finalizers": [*finalizers, FOREGROUND]}})

    def _stamp_create(self, request: kmock.Request) -> None:
        data: dict[str, Any] = request.data
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_version()
        meta["generation"] = 1
        meta["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert request.resource is not None
        if self._has_status(request.resource):
            data.pop("status", None)

    def _stamp_update(self, request: kmock.Request) -> None:
        assert request.resource is not None
        key: Any = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return
        old = self.objects[key].raw
        version = self._next_version()
        data = request.data
        status_only = request.subresource == "status"
        if isinstance(data, dict):
            if status_only:
                for extra in [k for k in data if k != "status"]:
                    data.pop(extra)
            elif self._has_status(request.resource):
                data.pop("status", None)
            new = _merge(old, data)
        else:
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(old), data)
            except jsonpatch.JsonPatchTestFailed as err:
                # An API server answers a failed `test` (kopf's resourceVersion check) with 422,
                # which kopf takes as "retry on the next event"; kmock would answer 500.
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(err)) from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
                return  # let the emulator answer the failing patch
        stamps = {"resourceVersion": version}
        if not status_only and new.get("spec") != old.get("spec"):
            stamps["generation"] = int(old.get("metadata", {}).get("generation") or 1) + 1  # type: ignore[assignment]
        if isinstance(data, dict):
            data.setdefault("metadata", {}).update(stamps)
        else:
            data.extend({"op": "add", "path": f"/metadata/{k}", "value": v} for k, v in stamps.items())

    # ---- conveniences for tests ----
    def peek(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object itself (no copy: read only), or None."""
        key = (kmock.resource(kind.group, kind.version, kind.plural), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw

    def get(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:  # type: ignore[override]
        """A copy of the stored object, or None."""
        found = self.peek(kind, namespace, name)
        return copy.deepcopy(found) if found is not None else None


async def wait_for(predicate: Any, within: float = 5.0, interval: float = 0.02) -> Any:
    """Poll `predicate()` (sync or async) until it returns something truthy; return that."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"condition not met within {within}s")
        await asyncio.sleep(interval)


class _ForeignTasks(Collection["asyncio.Task[Any]"]):
    """Tasks kopf must not stop when it exits: it assumes every task created after its start is
    its own, but here the emulator's request handlers and the test's own tasks share the loop."""

    def __init__(self, existing: set[asyncio.Task[Any]]) -> None:
        self.known = set(existing)

    def add(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self.known.add(task)

    def __contains__(self, task: object) -> bool:
        if task in self.known:
            return True
        coro = task.get_coro() if isinstance(task, asyncio.Task) else None
        code = getattr(coro, "cr_code", None)
        return bool(code and "aiohttp" in code.co_filename and "web_" in code.co_filename)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)


@contextlib.asynccontextmanager
async def embedded_operator(
    server: str,
    *,
    namespaces: list[str] | None = None,
    config: OperatorConfig | None = None,
    peering: str | None = None,
    login: handlers.Login | None = None,
    metrics_port: int | None = None,
) -> AsyncIterator[Reconciler]:
    """The operator's real handlers in this event loop, logged in to `server` with the bearer token
    `OPERATOR_TOKEN` (or by `login`, a kopf login function); stopped on exit.

    Cluster-wide unless `namespaces` are given (kopf then lists and watches namespaces: create them
    in the emulator first). Standalone unless `peering` names a peering object (ClusterKopfPeering
    when cluster-wide, KopfPeering in each namespace otherwise), which must exist: kopf keeps the
    operator paused until it has seen it. `metrics_port` serves `/metrics` (0: a free port, see
    `reconciler.metrics_server.port`).
    """
    registry = kopf.OperatorRegistry()
    reconciler = Reconciler(config or OperatorConfig())

    def token_login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server, insecure=True, token=OPERATOR_TOKEN)

    handlers.register(registry, reconciler, login=login or token_login, metrics_port=metrics_port,
                      metrics_host="127.0.0.1")

    foreign = _ForeignTasks(set(asyncio.all_tasks()))
    ready, stop = asyncio.Event(), asyncio.Event()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=kopf.OperatorSettings(),
        standalone=peering is None,
        peering_name=peering,
        namespaces=namespaces or [],
        clusterwide=not namespaces,
        ready_flag=ready,
        stop_flag=stop,
    )
    runner = asyncio.create_task(kopf.run_tasks(tasks, ignored=foreign))
    foreign.add(runner)
    try:
        await asyncio.wait_for(ready.wait(), 15)
        yield reconciler
    finally:
        foreign.add(asyncio.current_task())
        stop.set()
        # A timer spawned while kopf shuts down escapes its daemon killer (kopf then waits 5 s for
        # it as a "hung" task): once the root tasks are done, stop such leftovers at once.
        await asyncio.wait(tasks, timeout=15)
        for task in asyncio.all_tasks():
            if task not in foreign and task is not runner and not task.done():
                task.cancel()
        try:
            await asyncio.wait_for(runner, 15)
        except TimeoutError:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
