"""nats-py's WebSocket transport, loaded only by a process that dials a `ws://` or `wss://` URL.

nats-py imports aiohttp whenever it is installed, for its WebSocket transport alone: about 14 MB
resident in every worker, most of an idle one's memory, though a worker dials `nats://` or
`tls://` as a rule. The command line imports nats-py with aiohttp hidden
(`import_nats_without_websockets`), and the first connection to a WebSocket URL loads it
(`need_websockets`), as nats-py itself would have at import.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

WEBSOCKET_SCHEMES = ("ws://", "wss://")


def import_nats_without_websockets() -> None:
    """Import nats-py as if aiohttp were not installed (unless either is imported already); later
    imports of aiohttp, by this process's own code, work as ever."""
    if "nats.aio.transport" in sys.modules or "aiohttp" in sys.modules:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # `import aiohttp` raises ImportError
    try:
        import nats.aio.client  # noqa: F401
    finally:
        del sys.modules["aiohttp"]


def need_websockets(servers: Iterable[str]) -> None:
    """Before dialling `servers`: give nats-py its WebSocket transport's library if one is a WebSocket URL."""
    if not any(url.startswith(WEBSOCKET_SCHEMES) for url in servers):
        return
    from nats.aio import transport

    if transport.aiohttp is None:
        import aiohttp
        import multidict

        transport.aiohttp = aiohttp
        transport.multidict = multidict
