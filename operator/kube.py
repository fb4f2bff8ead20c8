"""The few Kubernetes API calls the operator makes, through kopf's own authenticated client.

kopf already holds the credentials (login handlers, re-authentication on 401, retries on 5xx and
429), so the operator reuses its API functions instead of adding a second client. They live in
kopf's private `_cogs` package: this module is the only place that touches them, so a kopf upgrade
that moves them breaks one file.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

import kopf
from kopf._cogs.clients import api as _kopf_api
from kopf._cogs.clients import errors as _kopf_errors
from replication_operator import naming

APIError = _kopf_errors.APIError
APINotFoundError = _kopf_errors.APINotFoundError
APIConflictError = _kopf_errors.APIConflictError

log = logging.getLogger(__name__)

APPLY_HEADERS = {"Content-Type": "application/apply-patch+yaml"}
MERGE_HEADERS = {"Content-Type": "application/merge-patch+json"}


def error_text(err: BaseException) -> str:
    """A short message for conditions and events: the API's status message, never a body."""
    if isinstance(err, APIError):
        return f"HTTP {err.status}: {err.message or 'no message'}"
    return f"{type(err).__name__}: {err}"


class KubeApi:
    """Get, server-side apply, delete and status patches for the operator's kinds."""

    def __init__(
        self, settings: kopf.OperatorSettings | None = None, logger: logging.Logger | None = None
    ) -> None:
        self.settings = settings or kopf.OperatorSettings()
        self.logger = logger or log

    async def _call(self, method: str, url: str, payload: object | None = None,
                    headers: dict[str, str] | None = None) -> Any:
        fn = {
            "get": _kopf_api.get,
            "post": _kopf_api.post,
            "patch": _kopf_api.patch,
            "delete": _kopf_api.delete,
        }[method]
        return await fn(url, payload=payload, headers=headers, settings=self.settings, logger=self.logger)

    async def get(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(await self._call("get", kind.path(namespace, name)))
        except APINotFoundError:
            return None

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with force: fields we own are put back, even after a hand edit.

        Apply creates missing objects on a real API server; a server that answers 404 instead
        (the test emulator) gets a plain create.
        """
        kind = naming.kind_of(dict(obj))
        meta = obj["metadata"]
        query = urllib.parse.urlencode({"fieldManager": naming.FIELD_MANAGER, "force": "true"})
        url = kind.path(meta["namespace"], meta["name"]) + "?" + query
        try:
            return dict(await self._call("patch", url, payload=obj, headers=APPLY_HEADERS))
        except APINotFoundError:
            manager = urllib.parse.urlencode({"fieldManager": naming.FIELD_MANAGER})
            return dict(await self._call("post", kind.path(meta["namespace"]) + "?" + manager, payload=obj))

    async def delete(self, kind: naming.Kind, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete (background propagation); with `uid`, only that incarnation. False if already gone."""
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("delete", kind.path(namespace, name), payload=body)
        except APINotFoundError:
            return False
        return True

    async def patch_status(self, kind: naming.Kind, namespace: str, name: str,
                           status: Mapping[str, Any]) -> dict[str, Any]:
        url = kind.path(namespace, name, "status")
        return dict(await self._call("patch", url, payload={"status": dict(status)}, headers=MERGE_HEADERS))
