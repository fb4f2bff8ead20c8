"""What a call to a NATS server raises when the server or the way to it fails, as opposed to a bug.

nats-py's errors (`nats.errors.Error`: JetStream's API errors, no responders, its timeouts, a closed
or reconnecting connection, a payload over the server's limit), the socket's (`OSError`: refused,
reset, TLS) and asyncio's `TimeoutError`. A loop that must outlive an outage catches `NATS_ERRORS`,
says so and goes on; anything else is a programming error and propagates, so that it is seen as one
and not taken for an unreachable server.
"""

from __future__ import annotations

import nats.errors

NATS_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, OSError, TimeoutError)
