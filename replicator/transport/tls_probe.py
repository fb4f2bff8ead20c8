"""What a TLS server thinks of our certificate, when a connection reset hid its answer.

Over TLS 1.3 the client's handshake is over before the server has judged the client
certificate. nats-py sends CONNECT straight away; a server that rejects the certificate
(unknown CA, expired) closes the connection with that CONNECT unread, and the kernel then resets
it instead of sending the alert that said why. The first connect sees "connection reset by
peer" and would retry for ever. A second handshake that sends nothing after it lets the server
close cleanly, so its alert arrives and names the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

PROBE_TIMEOUT = 2.0  # an accepted certificate hears nothing back: the probe waits this long for nothing


async def handshake_alert(host: str, port: int, context: ssl.SSLContext, *, handshake_first: bool = False,
                          timeout: float = PROBE_TIMEOUT) -> ssl.SSLError | None:
    """The server's TLS error for our certificate, or None if it raised none within `timeout`
    (accepted, or unreachable: the caller's own retries go on)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        if not handshake_first:
            await asyncio.wait_for(reader.readline(), timeout)  # the server's INFO, in the clear
        await asyncio.wait_for(writer.start_tls(context, server_hostname=host), timeout)
        await asyncio.wait_for(reader.read(1), timeout)
    except ssl.SSLError as err:
        return err
    except (OSError, TimeoutError, EOFError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return None
