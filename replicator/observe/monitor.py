"""`/metrics`, `/healthz` and `/readyz` on the `monitor` port.

Liveness says the event loop answers; readiness says every worker is connected to both sides and
bound to its consumer (or is a hot standby ready to take over), so a Service only routes to pods
that really replicate.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

ReadinessProbe = Callable[[], tuple[bool, dict[str, object]]]


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
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0 and site._server is not None:  # an ephemeral port: learn which one we got
            sockets = getattr(site._server, "sockets", None) or []
            if sockets:
                self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        if self.extra is not None:
            body += self.extra()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        ready, detail = self.readiness()
        return web.Response(
            status=200 if ready else 503,
            text=json.dumps({"ready": ready, **detail}),
            content_type="application/json",
        )
