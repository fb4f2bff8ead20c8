"""The native engine's NATS side: one connection to the *target*, with the resource's target
credentials, speaking the JetStream API's JSON directly.

Raw JSON rather than a client's dataclasses, so that a stream's config goes back to the server
exactly as it came (fields this operator does not know, in the stream or in someone else's source
entry, are never dropped). The source is only ever reached *through* the target (the domain's or
the imported API prefix): the operator opens no connection to the source's servers for this.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from replication_operator.engine import entry as native
from replication_operator.engine.entry import Route
from replication_operator.nats import connection

from replicator.config import redact_url
from replicator.copier.position import TargetPosition
from replicator.copier.provenance import Writer, stream_identity
from replicator.transport.streams import StreamSetupError, stream_created

API = "$JS.API"
STREAM_NOT_FOUND = 10059
NO_MESSAGE = 10037
# How far back from the target's last message on our subjects the search for the last message our
# entry delivered goes (other writers may have written after it).
SCAN_LIMIT = 5000


class NativeError(Exception):
    """Why the native engine could not do something; safe to show (no secrets, URLs redacted)."""


class JsApiError(NativeError):
    def __init__(self, err_code: int, description: str) -> None:
        super().__init__(f"{description} (error {err_code})")
        self.err_code = err_code
        self.description = description


def parse_headers(raw: bytes) -> dict[str, str]:
    """`NATS/1.0` header block -> dict (last value wins)."""
    headers: dict[str, str] = {}
    for line in raw.decode(errors="replace").split("\r\n")[1:]:
        if ":" in line:
            key, _, value = line.partition(":")
            headers[key.strip()] = value.strip()
    return headers


def target_subject(destinations: tuple[str, ...], filters: tuple[str, ...]) -> str:
    """Where the entry's messages land on the target, as a subject filter."""
    if destinations == (native.ALL,):
        return filters[0]
    tokens = ["*" if t.startswith("{{") else t for t in destinations[0].split(".")]
    return ".".join(tokens)


class TargetSession:
    """`async with TargetSession(url, auth, timeout) as target:` one short-lived connection."""

    def __init__(self, url: str, auth: connection.Auth, time_limit: float) -> None:
        self.url = url
        self.auth = auth
        self.time_limit = time_limit
        self.nc: Client | None = None

    async def __aenter__(self) -> TargetSession:
        try:
            self.nc = await connection.connect(self.url, self.auth, self.time_limit)
        except connection.NatsStatusError as err:
            raise NativeError(str(err)) from None
        return self

    async def __aexit__(self, kind: type[BaseException] | None, err: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def api(self, subject: str, body: Mapping[str, Any] | None = None, prefix: str = API) -> dict[str, Any]:
        assert self.nc is not None
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await self.nc.request(f"{prefix}.{subject}", payload, timeout=self.time_limit)
        except NoRespondersError:
            raise NativeError(f"no JetStream answers on {prefix} at {redact_url(self.url)}") from None
        except NatsTimeout:
            raise NativeError(f"no answer from {prefix} within {self.time_limit:g}s") from None
        data = json.loads(msg.data or b"{}")
        error = data.get("error")
        if error:
            raise JsApiError(int(error.get("err_code") or 0), str(error.get("description") or error))
        return dict(data)

    # ---- the source, through the target ----
    async def source_stream(self, route: Route, stream: str | None, topic: str) -> tuple[str, dict[str, Any]]:
        """(name, stream info) of the source stream as the target sees it through `route`."""
        if not stream:
            names = (await self.api("STREAM.NAMES", {"subject": topic}, prefix=route.api)).get("streams") or []
            if len(names) != 1:
                found = ", ".join(names) if names else "none"
                raise NativeError(f"no single source stream captures {topic} (found: {found})")
            stream = str(names[0])
        try:
            return stream, await self.api(f"STREAM.INFO.{stream}", prefix=route.api)
        except JsApiError as err:
            if err.err_code == STREAM_NOT_FOUND:
                raise NativeError(f"source stream {stream} not found through {route.via}") from None
            raise

    # ---- the target stream ----
    async def stream_info(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.api(f"STREAM.INFO.{name}")
        except JsApiError as err:
            if err.err_code == STREAM_NOT_FOUND:
                return None
            raise

    async def create_stream(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return await self.api(f"STREAM.CREATE.{config['name']}", config)

    async def update_stream(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return await self.api(f"STREAM.UPDATE.{config['name']}", config)

    async def message(self, stream: str, request: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            return dict((await self.api(f"STREAM.MSG.GET.{stream}", request)).get("message") or {})
        except JsApiError as err:
            if err.err_code in (NO_MESSAGE, STREAM_NOT_FOUND):
                return None
            raise

    async def last_delivered(self, stream: str, recorded: Mapping[str, Any],
                             before: Callable[[dict[str, str]], bool] = lambda _: False) -> int | None:
        """The last source sequence the entry recorded in status.native delivered to `stream`
        (from the server's `Nats-Stream-Source` header); None when it delivered nothing: the stream
        holds no message on its subjects, or the search reaches its start or a message `before`
        recognises as older than anything the entry delivered (the replicator's last copy)."""
        filters = tuple(recorded.get("filterSubjects") or [native.ALL])
        destinations = tuple(recorded.get("destinations") or [native.ALL])
        entry = native.recorded_entry(recorded)
        last = await self.message(stream, {"last_by_subj": target_subject(destinations, filters)})
        if not last:
            return None
        seq = int(last.get("seq") or 0)
        for candidate in range(seq, max(0, seq - SCAN_LIMIT), -1):
            msg = last if candidate == seq else await self.message(stream, {"seq": candidate})
            if not msg:
                continue
            headers = parse_headers(base64.b64decode(msg.get("hdrs") or "")) if msg.get("hdrs") else {}
            found = native.delivered_sequence(headers.get(native.SOURCE_HEADER), entry)
            if found is not None:
                return found
            if before(headers):
                return None
        if seq <= SCAN_LIMIT:
            return None
        raise NativeError(f"no message from the source entry among the last {SCAN_LIMIT} of stream {stream}")

    async def writer(self, route: Route, source_stream: str, name: str) -> Writer:
        """The replicator's writer identity for this source stream instance (read through `route`)."""
        assert self.nc is not None
        try:
            created = await stream_created(self.nc, source_stream, route.api, self.time_limit)
        except (StreamSetupError, NoRespondersError, NatsTimeout) as err:
            raise NativeError(f"cannot read source stream {source_stream} through {route.via}: {err}") from None
        return Writer(source_stream, name, stream_identity(created))

    async def replicator_landed(self, stream: str, subject: str, writer: Writer) -> int:
        """The last source sequence the replicator (`writer`) landed on `stream`, from its provenance
        header, found as the replicator itself finds it when resuming."""
        assert self.nc is not None
        landed = await TargetPosition(self.nc, stream, subject, writer).last_landed(floor=0, scan=True)
        return landed.source_seq
