"""Security fixtures: a test PKI, TLS and authenticated nats-servers, and a CLI runner with a deadline.

Servers verify client certificates (`verify: true`), so the test's own clients present one too.
Everything listens on 127.0.0.1; server certificates carry SAN IP 127.0.0.1.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from tests.support.certs import CertificateAuthority, TlsFiles, server_tls_block, write_client, write_server

PASSWORD = "pw-Zq8tV2mK4pL9x"  # distinctive: a hit in any output is certainly a leak
TOKEN = "tok-s3cr3t-9f8e7d6c5b4a"
USER = "replicator"


@dataclass
class Pki:
    dir: Path
    ca: CertificateAuthority
    other_ca: CertificateAuthority  # a second, unrelated CA (rogue, or another cluster's)

    def server(self, name: str, *, expired: bool = False, ca: CertificateAuthority | None = None,
               ips: tuple[str, ...] = ("127.0.0.1",)) -> TlsFiles:
        issuer = ca or self.ca
        if ips != ("127.0.0.1",):
            issued = issuer.issue(name, server=True, client=True, ips=ips, dns=())
            cert, key = issued.write(self.dir / name / f"{name}.pem", self.dir / name / f"{name}-key.pem")
            return TlsFiles(issuer.write_ca(self.dir / name / "ca.pem"), cert, key)
        return write_server(issuer, self.dir / name, name, expired=expired)

    def client(self, name: str, *, ca: CertificateAuthority | None = None,
               trust: CertificateAuthority | None = None, expired: bool = False) -> TlsFiles:
        issuer = ca or self.ca
        return write_client(issuer, self.dir / f"client-{name}", name, expired=expired, trust=trust or issuer)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki", CertificateAuthority.create("sr-test-ca"),
               CertificateAuthority.create("other-ca"))


ServerFactory = Callable[..., LocalNatsServer]


@pytest.fixture
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Start servers with extra config (tls, authorization); all are stopped after the test."""
    started: list[LocalNatsServer] = []

    def start(name: str, extra: str = "", scheme: str = "nats") -> LocalNatsServer:
        server = LocalNatsServer(name=name, store_dir=tmp_path_factory.mktemp(name), extra_config=extra,
                                 scheme=scheme)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.close()


def tls_server(factory: ServerFactory, name: str, files: TlsFiles) -> LocalNatsServer:
    return factory(name, server_tls_block(files), scheme="tls")


def client_context(files: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files.ca))
    ctx.load_cert_chain(str(files.cert), str(files.key))
    return ctx


@pytest.fixture
async def connect_tls() -> AsyncIterator[Callable[..., object]]:
    """Test clients for TLS servers (closed after the test)."""
    clients: list[Client] = []

    async def connect(server: LocalNatsServer, files: TlsFiles) -> Client:
        nc = await nats.connect(server.url, tls=client_context(files), max_reconnect_attempts=3)
        clients.append(nc)
        return nc

    yield connect
    for nc in clients:
        await nc.close()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    seconds: float


def run_cli(*args: str, within: float = 30.0) -> CliResult:
    """The console script as a process; a run that does not end within the deadline is a hang."""
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "replicator", *args], capture_output=True, text=True,
                              timeout=within)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        raise AssertionError(f"no exit within {within}s (it hangs); output:\n{out[-3000:]}") from None
    return CliResult(done.returncode, done.stdout, done.stderr, time.monotonic() - began)


def assert_clean_failure(result: CliResult, *needles: str) -> None:
    """Non-zero exit, an error line naming what went wrong, and no traceback.

    """
    text = result.stderr + result.stdout
    assert result.code != 0, f"exit {result.code}\n{text[-3000:]}"
    lines = [line for line in text.splitlines() if all(n.lower() in line.lower() for n in needles)]
    assert lines, f"no line names {needles}:\n{text[-3000:]}"
    if "Traceback" in result.stderr:
        raise AssertionError(f"traceback:\n{result.stderr[-3000:]}")
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, f"want one error line on stderr, got:\n{result.stderr}"
