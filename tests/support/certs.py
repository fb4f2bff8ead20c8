"""Test PKI built with `cryptography`: a CA, server and client certificates, expired ones, a rogue CA.

The security tests need real TLS between the replicator and real nats-server processes, so the
material must be generated per test run (never checked in: checked-in keys expire and leak).
EC P-256 keys keep generation to milliseconds. Server certificates carry SAN IP 127.0.0.1 (and
DNS localhost) because the tests connect to loopback addresses and Python verifies hostnames.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey


def _key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "stream-replicator tests"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class Issued:
    """A certificate with its key, written as PEM files on request."""

    cert: x509.Certificate
    key: PrivateKey

    def write(self, cert_path: Path, key_path: Path) -> tuple[Path, Path]:
        cert_path.parent.mkdir(parents=True, exist_ok=True)
        key_path.parent.mkdir(parents=True, exist_ok=True)
        cert_path.write_bytes(cert_pem(self.cert))
        key_path.write_bytes(key_pem(self.key))
        key_path.chmod(0o600)
        return cert_path, key_path


@dataclass
class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    name: str
    cert: x509.Certificate
    key: PrivateKey

    @classmethod
    def create(cls, name: str = "sr-test-ca", days: int = 30) -> CertificateAuthority:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(name, cert, key)

    def write_ca(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(cert_pem(self.cert))
        return path

    @property
    def pem(self) -> bytes:
        return cert_pem(self.cert)

    def issue(
        self,
        common_name: str,
        *,
        server: bool = False,
        client: bool = False,
        expired: bool = False,
        ips: tuple[str, ...] = ("127.0.0.1",),
        dns: tuple[str, ...] = ("localhost",),
        days: int = 7,
    ) -> Issued:
        """A leaf certificate; `expired` makes one that ended yesterday (valid signature, wrong dates)."""
        import ipaddress

        key = _key()
        now = dt.datetime.now(dt.UTC)
        if expired:
            start, end = now - dt.timedelta(days=10), now - dt.timedelta(days=1)
        else:
            start, end = now - dt.timedelta(hours=1), now + dt.timedelta(days=days)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        if server:
            names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            names += [x509.DNSName(d) for d in dns]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return Issued(builder.sign(self.key, hashes.SHA256()), key)


def bundle(*cas: CertificateAuthority) -> bytes:
    """A CA bundle: several CAs in one PEM file (the overlap of a CA rotation)."""
    return b"".join(ca.pem for ca in cas)


def spki_sha256(cert: x509.Certificate) -> str:
    """What nats-server's `pinned_certs` lists: SHA-256 of the DER SubjectPublicKeyInfo, in hex."""
    import hashlib

    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


@dataclass
class TlsFiles:
    """Paths of one party's material: what a `tls {}` block or a `manual` TLS config names."""

    ca: Path
    cert: Path
    key: Path


def server_tls_block(files: TlsFiles, *, verify: bool = True, timeout: float = 2.0,
                     pinned: tuple[str, ...] = ()) -> str:
    """The nats-server `tls {}` block for `LocalNatsServer(extra_config=...)`; `pinned` lists the
    only client certificates accepted (`spki_sha256`), and a reload disconnects any other."""
    quoted = ", ".join(f'"{p}"' for p in pinned)
    pins = f"  pinned_certs: [{quoted}]\n" if pinned else ""
    return (
        "tls {\n"
        f'  cert_file: "{files.cert}"\n'
        f'  key_file: "{files.key}"\n'
        f'  ca_file: "{files.ca}"\n'
        f"  verify: {'true' if verify else 'false'}\n"
        f"  timeout: {timeout}\n"
        f"{pins}"
        "}\n"
    )


def write_server(ca: CertificateAuthority, directory: Path, name: str, *, expired: bool = False) -> TlsFiles:
    issued = ca.issue(name, server=True, client=True, expired=expired)
    cert, key = issued.write(directory / f"{name}.pem", directory / f"{name}-key.pem")
    return TlsFiles(ca.write_ca(directory / "ca.pem"), cert, key)


def write_client(ca: CertificateAuthority, directory: Path, identity: str, *, expired: bool = False,
                 trust: CertificateAuthority | None = None) -> TlsFiles:
    """Manual layout. `trust` is the CA the client believes in (default: the issuing one)."""
    issued = ca.issue(identity, client=True, expired=expired)
    cert, key = issued.write(directory / f"{identity}.pem", directory / f"{identity}-key.pem")
    return TlsFiles((trust or ca).write_ca(directory / "client-ca.pem"), cert, key)


def write_puppet(ca: CertificateAuthority, ssl_dir: Path, identity: str) -> TlsFiles:
    """The Puppet layout the legacy tool reads: certs/ca.pem, certs/<id>.pem, private_keys/<id>.pem."""
    issued = ca.issue(identity, client=True)
    cert, key = issued.write(ssl_dir / "certs" / f"{identity}.pem",
                             ssl_dir / "private_keys" / f"{identity}.pem")
    return TlsFiles(ca.write_ca(ssl_dir / "certs" / "ca.pem"), cert, key)
