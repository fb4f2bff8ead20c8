"""The Kubernetes API calls the operator makes, through the official client's asyncio flavour.

kopf keeps its own connection for watching and for its bookkeeping (finalizers, progress, events);
everything the operator itself reads or writes (children, status, Secrets) goes through the
official `kubernetes` client (`kubernetes.aio`, the package's own asyncio client: no thread and no
blocking call in the event loop). Both log in with the same credentials: the operator's login
handler (handlers.py) hands kopf's `ConnectionInfo` to `KubeApi.use`, and on a 401 the client logs
in again the same way. Only kopf's public API is used, so a kopf upgrade cannot break this module.

The error contract, which every caller relies on: a call that fails raises `APIError` and nothing
else. An answer with an error status keeps it (`APINotFoundError` for 404, `APIConflictError` for
409); no answer at all (refused, reset, TLS failure, `REQUEST_TIMEOUT`) is `APIError` with status
0, raised only after the `BACKOFFS` retries that 0, 429 and 5xx get; a 401 logs in again once.
`TimeoutError` and the client's own exceptions never leave this module. Absence is not an error
where it is an answer: `get` returns None, `delete` False, `get_quietly` None for any failure
(logged). `retryable` says which statuses are worth another pass soon.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import kopf
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from replication_operator.model import naming

log = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON = "application/json"
# Transient failures (no answer, 429, 5xx) are retried after these pauses, then reported.
BACKOFFS = (0.5, 1.0, 2.0)
REQUEST_TIMEOUT = 30.0

Relogin = Callable[[], Awaitable[kopf.ConnectionInfo | None]]


class APIError(Exception):
    """An API call failed: `status` is the HTTP status, 0 when the API server did not answer (see the
    module's error contract)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def retryable(self) -> bool:
        """No answer, a conflict, throttling or a server error: another pass soon may succeed."""
        return self.status >= 500 or self.status in (0, 409, 429)


class APINotFoundError(APIError):
    pass


class APIConflictError(APIError):
    pass


def error_text(err: APIError) -> str:
    """A short message for conditions and events: the API's status message, never a body."""
    return f"HTTP {err.status}: {err.message or 'no message'}" if err.status else err.message


def _api_error(err: ApiException) -> APIError:
    status = int(err.status or 0)
    message = str(err.reason or "")
    try:
        body = json.loads(err.body) if err.body else {}
        message = str(body.get("message") or message)
    except (TypeError, ValueError, AttributeError):
        pass
    kind = {404: APINotFoundError, 409: APIConflictError}.get(status, APIError)
    return kind(status, message)


class KubeApi:
    """Get, server-side apply, delete and status patches for the operator's kinds."""

    def __init__(self) -> None:
        self._client: k8s.ApiClient | None = None
        self._files: tempfile.TemporaryDirectory[str] | None = None
        self._retired: list[k8s.ApiClient] = []
        self.relogin: Relogin | None = None

    # ---- login ----
    def use(self, info: kopf.ConnectionInfo) -> None:
        """Talk to the API server `info` describes (what kopf's login handlers return)."""
        config = k8s.Configuration(host=info.server.rstrip("/"))
        config.verify_ssl = not info.insecure
        config.ssl_ca_cert = _path(info.ca_path)
        if info.ca_data:
            config.ca_cert_data = _pem(info.ca_data)
        config.cert_file = _path(info.certificate_path) or self._file("tls.crt", info.certificate_data)
        config.key_file = _path(info.private_key_path) or self._file("tls.key", info.private_key_data)
        if info.token:
            config.api_key = {"BearerToken": info.token}
            config.api_key_prefix = {"BearerToken": info.scheme or "Bearer"}
        if getattr(info, "proxy_url", None):
            config.proxy = info.proxy_url
        config.retries = None  # retried here, with the reconciler's view of what is transient
        old, self._client = self._client, k8s.ApiClient(config)
        if info.username and info.password and not info.token:
            pair = base64.b64encode(f"{info.username}:{info.password}".encode()).decode()
            self._client.set_default_header("Authorization", f"Basic {pair}")
        if old is not None:
            self._retired.append(old)  # closed with the rest: a request may still be using it

    def _file(self, name: str, data: bytes | str | None) -> str | None:
        """Client certificate material given as data: the client reads files (0600 in a 0700 dir)."""
        if not data:
            return None
        if self._files is None:
            self._files = tempfile.TemporaryDirectory(prefix="sr-op-kube-")
            os.chmod(self._files.name, 0o700)
        path = os.path.join(self._files.name, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        return path

    async def close(self) -> None:
        for api in [*self._retired, self._client]:
            if api is not None:
                await api.close()
        self._client, self._retired = None, []
        if self._files is not None:
            self._files.cleanup()
            self._files = None

    # ---- one request ----
    async def _call(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                    body: object | None = None, content_type: str = JSON) -> Any:
        relogged = False
        for attempt in range(len(BACKOFFS) + 1):
            try:
                return await self._request(method, path, query, body, content_type)
            except ApiException as err:
                failure = _api_error(err)
                if failure.status == 401 and not relogged and self.relogin is not None:
                    relogged = True
                    info = await self.relogin()
                    if info is not None:
                        self.use(info)
                        continue
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                failure = APIError(0, f"no answer from the API server: {type(err).__name__}: {err}")
            retryable = failure.status == 0 or failure.status == 429 or failure.status >= 500
            if not retryable or attempt == len(BACKOFFS):
                raise failure
            await asyncio.sleep(BACKOFFS[attempt])
        raise AssertionError("unreachable")  # pragma: no cover

    async def _request(self, method: str, path: str, query: Mapping[str, str] | None,
                       body: object | None, content_type: str) -> Any:
        api = self._client
        if api is None:
            raise APIError(0, "not logged in to the API server yet")
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        method_, url, headers_, body_, post = await api.param_serialize(
            method=method, resource_path=path, query_params=list((query or {}).items()),
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )
        response = await api.call_api(method_, url, header_params=headers_, body=body_, post_params=post,
                                      _request_timeout=REQUEST_TIMEOUT)
        await response.read()
        return api.response_deserialize(response, {"2XX": "object"}).data

    # ---- what the reconciler uses ----
    async def get(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(await self._call("GET", kind.path(namespace, name)))
        except APINotFoundError:
            return None

    async def get_quietly(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        """`get`, with a failure logged and taken for absence: for reads whose caller acts only on
        what it finds (and finds it again on its next pass)."""
        try:
            return await self.get(kind, namespace, name)
        except APIError as err:
            log.warning("cannot read %s %s/%s: %s", kind.kind, namespace, name, error_text(err))
            return None

    async def list(self, kind: naming.Kind, namespace: str) -> list[dict[str, Any]]:
        """Every object of the kind in the namespace."""
        found = dict(await self._call("GET", kind.path(namespace)))
        return [dict(item) for item in found.get("items") or []]

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with force: fields we own are put back, even after a hand edit.

        Apply creates missing objects on a real API server; a server that answers 404 instead
        (the test emulator) gets a plain create.
        """
        kind = naming.kind_of(dict(obj))
        meta = obj["metadata"]
        query = {"fieldManager": naming.FIELD_MANAGER, "force": "true"}
        try:
            return dict(await self._call("PATCH", kind.path(meta["namespace"], meta["name"]), query=query,
                                         body=dict(obj), content_type=APPLY))
        except APINotFoundError:
            return dict(await self._call("POST", kind.path(meta["namespace"]),
                                         query={"fieldManager": naming.FIELD_MANAGER}, body=dict(obj)))

    async def delete(self, kind: naming.Kind, namespace: str, name: str, uid: str | None = None,
                     foreground: bool = False) -> bool:
        """Delete; with `uid`, only that incarnation. `foreground`: the object stays (with a
        deletionTimestamp) until the garbage collector has removed its dependents (a Deployment's
        pods). False if already gone."""
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "DeleteOptions",
            "propagationPolicy": "Foreground" if foreground else "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", kind.path(namespace, name), body=body)
        except APINotFoundError:
            return False
        return True

    async def patch_status(self, kind: naming.Kind, namespace: str, name: str,
                           status: Mapping[str, Any]) -> dict[str, Any]:
        return dict(await self._call("PATCH", kind.path(namespace, name, "status"),
                                     body={"status": dict(status)}, content_type=MERGE))


def _path(value: Any) -> str | None:
    return os.fsdecode(value) if value else None


def _pem(data: bytes | str) -> str | bytes:
    """PEM text as str (the ssl module reads bytes as DER)."""
    if isinstance(data, bytes) and data.lstrip().startswith(b"-----"):
        return data.decode()
    return data
