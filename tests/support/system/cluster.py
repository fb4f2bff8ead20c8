"""The API emulator as the system test's cluster: the operator's kinds plus what a chart install and a
kubelet write (ServiceAccounts, RBAC, Endpoints, PrometheusRules), and installing rendered objects."""

from __future__ import annotations

import copy
from typing import Any

import kmock

from tests.support.kube_emulator import ALL_VERBS, ClusterEmulator

# (group/version/plural, kind, namespaced): the kinds a chart install adds to the operator's.
EXTRA: list[tuple[str, str, bool]] = [
    ("v1/serviceaccounts", "ServiceAccount", True),
    ("v1/endpoints", "Endpoints", True),
    ("rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io/v1/roles", "Role", True),
    ("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding", True),
    ("monitoring.coreos.com/v1/prometheusrules", "PrometheusRule", True),
]


class SystemCluster(ClusterEmulator):
    """The operator's emulator, serving every kind the chart renders too."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for path, kind, namespaced in EXTRA:
            self.resources[path] = kmock.ResourceInfo(kind=kind, singular=kind.lower(), namespaced=namespaced,
                                                      verbs=set(ALL_VERBS), subresources=set())

    def _info(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(URL base "api/v1" or "apis/<group>/<version>" + plural, namespaced) of a kind."""
        for resource, info in self.resources.items():
            group_version = f"{resource.group}/{resource.version}" if resource.group else str(resource.version)
            plural = str(resource.plural)
            if group_version == api_version and info.kind == kind:
                return f"{'apis' if '/' in group_version else 'api'}/{group_version}/{plural}", bool(info.namespaced)
        raise KeyError(f"the emulator serves no {api_version} {kind}")

    def url_of(self, obj: dict[str, Any], name: bool = False, subresource: str | None = None) -> str:
        base, namespaced = self._info(obj["apiVersion"], obj["kind"])
        group_version, plural = base.rsplit("/", 1)
        namespace = obj["metadata"].get("namespace")
        url = f"/{group_version}/namespaces/{namespace}/{plural}" if namespaced else f"/{base}"
        if name:
            url += f"/{obj['metadata']['name']}"
        if subresource:
            url += f"/{subresource}"
        return url

    def objects_of(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies of the stored objects of a kind (in a namespace, or all)."""
        found = []
        for (resource, ns, _), obj in self.objects.items():
            if obj.deleted or resource.plural is None:
                continue
            raw = obj.raw
            if raw.get("apiVersion") == api_version and raw.get("kind") == kind and namespace in (None, ns):
                found.append(copy.deepcopy(dict(raw)))
        return found

    async def send(self, method: str, url: str, body: Any = None,
                   content_type: str = "application/merge-patch+json") -> dict[str, Any]:
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.request(method, url, json=body, headers=headers) as resp:
            data = await resp.json()
            if resp.status >= 300:
                raise AssertionError(f"{method} {url}: {resp.status} {data}")
            return dict(data)

    async def install(self, objects: list[dict[str, Any]], namespace: str) -> None:
        """Create rendered objects as `kubectl apply` would (namespaced ones default to `namespace`)."""
        for obj in objects:
            obj = dict(obj)
            if self._info(obj["apiVersion"], obj["kind"])[1]:
                obj["metadata"] = {"namespace": namespace, **obj["metadata"]}
            await self.send("POST", self.url_of(obj), obj)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create the object, or merge-patch it when it exists."""
        meta = obj["metadata"]
        for existing in self.objects_of(obj["apiVersion"], obj["kind"], meta.get("namespace")):
            if existing["metadata"]["name"] == meta["name"]:
                return await self.send("PATCH", self.url_of(obj, name=True), obj)
        return await self.send("POST", self.url_of(obj), obj)

    async def delete(self, obj: dict[str, Any]) -> None:
        await self.send("DELETE", self.url_of(obj, name=True))
