"""`/metrics`, `/healthz` and `/readyz` on the `monitor` port.

Liveness says the event loop answers; readiness says every worker is connected to both sides and
bound to its consumer (or is a hot standby ready to take over), so a Service only routes to pods
that really replicate.

Three fixed GET answers over asyncio's own server: an HTTP framework would be most of an idle
worker's memory (aiohttp alone is about 14 MB resident, more than the copy itself). Each answer
closes its connection (`Connection: close`), which Prometheus, the kubelet's probes and curl all
take; a request line or headers larger than `MAX_REQUEST` bytes, or slower than
`REQUEST_TIMEOUT`, is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

ReadinessProbe = Callable[[], tuple[bool, dict[str, object]]]

MAX_REQUEST = 16 * 1024
REQUEST_TIMEOUT = 10.0
REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
JSON = "application/json"


class MonitorServer:
    def __init__(
        self, registry: CollectorRegistry, readiness: ReadinessProbe, port: int, host: str = "0.0.0.0",
        *, extra: Callable[[], bytes] | None = None,
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.port = port
        self.host = host
        # More text exposition after the registry's (the Go-format families, see gometrics.py).
        self.extra = extra
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_REQUEST)
        if self.port == 0 and self._server.sockets:  # an ephemeral port: learn which one we got
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a request."""
        path = path.split("?", 1)[0]
        if path not in ("/metrics", "/healthz", "/readyz"):
            return 404, "text/plain", b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/metrics":
            body = generate_latest(self.registry)
            if self.extra is not None:
                body += self.extra()
            return 200, CONTENT_TYPE_LATEST, body
        if path == "/healthz":
            return 200, JSON, b'{"status": "ok"}'
        ready, detail = self.readiness()
        return 200 if ready else 503, JSON, json.dumps({"ready": ready, **detail}).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path, *_ = [*head.split(b"\r\n", 1)[0].decode("latin-1").split(" "), "", ""]
            status, content_type, body = self.answer(method, path)
            writer.write(f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that went away, or sent nothing usable: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
