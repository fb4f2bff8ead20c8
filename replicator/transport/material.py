"""Connection material from files (CA bundle, client certificate and key, `.creds`, JWT, nkey seed,
user name and password), reloaded when a file changes.

nats-py builds its TLS context and credential callbacks once, at the first connect. Connections
made here instead ask a `MaterialSource` at every TLS handshake and every CONNECT (see
`transport/connections.py`), and the source checks its files each time it is asked: a file counts
as changed when its resolved path, inode, size or modification time changes (kubelet's atomic
`..data` symlink swap, a rename over it, an in-place rewrite) *and* its content hash differs. A
change is parsed in full (PEM, key against certificate, JWT against seed) before it replaces
anything; a change that does not parse (a half-written file, a key that does not match its
certificate) keeps the last good material, logs one warning naming the file (never its content)
and is retried as soon as the files change again.

A new credential source is one entry in `ROLES` and a few lines in `_user` (or `_basic`): everything
else (change detection, last-good, warnings, the callbacks the connection uses) is shared.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import logging
import math
import os
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger(__name__)

# Every kind of file a connection may read, in the order they are checked and named in messages.
ROLES = ("ca", "cert", "key", "creds", "jwt", "seed", "username", "password", "token")
CertificateRole = Literal["client", "ca"]


class MaterialError(Exception):
    """Material that cannot be used; names the file (or Secret key), never its content."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class MaterialFiles:
    """What one side of a connection reads. `tls` is true when TLS is configured at all (without a
    `ca` the system's CAs verify the server); `jwt` + `seed` are a `.creds` file in two parts, a
    `seed` alone is nkey authentication; `username` + `password` are user/password authentication
    (a `kubernetes.io/basic-auth` Secret's two keys); `token` is token authentication."""

    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure: bool = False
    creds: str | None = None
    jwt: str | None = None
    seed: str | None = None
    username: str | None = None
    password: str | None = None
    token: str | None = None

    def paths(self) -> dict[str, str]:
        return {role: path for role in ROLES if (path := getattr(self, role))}

    def __bool__(self) -> bool:
        return self.tls or bool(self.paths())


@dataclass(frozen=True)
class CertificateInfo:
    role: CertificateRole
    where: str  # the file (or Secret key) it came from
    subject: str
    not_after: float  # unix seconds


@dataclass(frozen=True, repr=False)
class UserIdentity:
    """A NATS user: a JWT with the nkey seed that signs the server's nonce, or a bare nkey."""

    seed: bytes
    public_key: str
    jwt: bytes | None = None

    def sign(self, nonce: str) -> bytes:
        import nkeys  # with PyNaCl, only a process that signs with an nkey loads it

        kp = nkeys.from_seed(bytearray(self.seed))
        try:
            return base64.b64encode(kp.sign(nonce.encode()))
        finally:
            kp.wipe()

    def user_jwt(self) -> bytearray:
        assert self.jwt is not None
        return bytearray(self.jwt)


@dataclass(frozen=True, repr=False)
class BasicAuth:
    """A user name and password, sent in CONNECT as `user` and `pass` (never logged: no repr)."""

    user: str
    password: str


@dataclass(frozen=True, repr=False)
class Material:
    """One consistent, parsed generation of a side's files."""

    ssl_context: ssl.SSLContext | None = None
    certificates: tuple[CertificateInfo, ...] = ()
    user: UserIdentity | None = None
    basic: BasicAuth | None = None
    token: str | None = field(default=None, repr=False)

    def not_after(self, role: CertificateRole) -> float | None:
        """The first of `role`'s certificates to expire (a CA bundle may hold several)."""
        times = [c.not_after for c in self.certificates if c.role == role]
        return min(times) if times else None


# ---- parsing (pure: names and bytes in, Material or MaterialError out) ----

def build(files: MaterialFiles, data: Mapping[str, bytes], names: Mapping[str, str] | None = None) -> Material:
    """Parse `data` (role -> bytes); `names` (role -> file or Secret key) is what messages name."""
    where = {**files.paths(), **(names or {})}
    certificates: list[CertificateInfo] = []
    context = None
    if files.tls:
        context, certificates = _tls(files, data, where)
    return Material(context, tuple(certificates), _user(data, where), _basic(data, where), _token(data, where))


def parse_certificates(data: bytes, where: str, role: CertificateRole) -> list[CertificateInfo]:
    from cryptography import x509  # about 10 MB resident: only a process that reads certificates loads it

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise MaterialError(where, "not a PEM certificate (incomplete or damaged?)") from None
    return [CertificateInfo(role, where, c.subject.rfc4514_string(), c.not_valid_after_utc.timestamp())
            for c in certs]


def _tls(files: MaterialFiles, data: Mapping[str, bytes],
         where: Mapping[str, str]) -> tuple[ssl.SSLContext, list[CertificateInfo]]:
    found: list[CertificateInfo] = []
    ca = data.get("ca")
    if ca is not None:
        found += parse_certificates(ca, where["ca"], "ca")
    cert, key = data.get("cert"), data.get("key")
    if (cert is None) != (key is None):
        missing = "key" if key is None else "cert"
        raise MaterialError(where.get("cert") or where.get("key", "?"), f"has no matching {missing}")
    if cert is not None and key is not None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        client = parse_certificates(cert, where["cert"], "client")
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError):
            raise MaterialError(where["key"], "not an unencrypted PEM private key (incomplete or damaged?)") from None
        leaf = x509.load_pem_x509_certificates(cert)[0]
        spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if private.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
            raise MaterialError(where["key"], f"does not match the certificate in {where['cert']}")
        found.append(client[0])  # the leaf; the rest of the file is its chain
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode() if ca else None)
        if cert is not None and key is not None:
            _load_chain(ctx, cert, key)
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as err:
        raise MaterialError(", ".join(where[r] for r in ("ca", "cert", "key") if r in data),
                            f"unusable for TLS ({getattr(err, 'reason', None) or err})") from None
    if files.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx, found


def _load_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """`load_cert_chain` reads only files: the exact bytes that were checked go to anonymous
    in-memory files (Linux), so the key never touches a disk and a read-only root needs no /tmp;
    elsewhere to a private directory that lives for this call."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create(name, os.MFD_CLOEXEC) for name in ("tls.crt", "tls.key")]
        try:
            for fd, content in zip(fds, (cert, key), strict=True):
                os.write(fd, content)
            ctx.load_cert_chain(*(f"/proc/self/fd/{fd}" for fd in fds))
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="sr-tls-") as tmp:
        os.chmod(tmp, 0o700)
        paths = []
        for name, content in (("tls.crt", cert), ("tls.key", key)):
            path = os.path.join(tmp, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
            paths.append(path)
        ctx.load_cert_chain(*paths)


_BLOCK = re.compile(rb"-{3,}[^\n]*BEGIN ([A-Z ]+)-{3,}\s*\n\s*([^\s-][^\n]*?)\s*\n\s*-{3,}[^\n]*END \1-{3,}")


def _user(data: Mapping[str, bytes], where: Mapping[str, str]) -> UserIdentity | None:
    if "creds" in data:  # a .creds file: the user JWT and its nkey seed in two armoured blocks
        blocks = {kind.decode(): body for kind, body in _BLOCK.findall(data["creds"])}
        jwt, seed = blocks.get("NATS USER JWT"), blocks.get("USER NKEY SEED")
        if not jwt or not seed:
            raise MaterialError(where["creds"], "not a credentials file (needs a user JWT and an nkey seed; "
                                                "incomplete?)")
        return _identity(seed, where["creds"], jwt, where["creds"])
    if "seed" in data:  # a seed file, with a JWT file (decentralised auth) or alone (nkey auth)
        jwt = _undecorated(data["jwt"], "NATS USER JWT") if "jwt" in data else None
        return _identity(_undecorated(data["seed"], "USER NKEY SEED"), where["seed"], jwt, where.get("jwt"))
    if "jwt" in data:
        raise MaterialError(where["jwt"], "a user JWT needs its nkey seed")
    return None


def _basic(data: Mapping[str, bytes], where: Mapping[str, str]) -> BasicAuth | None:
    """A user name file and a password file (the keys of a `kubernetes.io/basic-auth` Secret). The
    line ends a file written by `echo` carries are not part of the value; an empty file is one caught
    half-written, never a password."""
    if "username" not in data and "password" not in data:
        return None
    values: dict[str, str] = {}
    for role in ("username", "password"):
        if role not in data:
            other = "password" if role == "username" else "username"
            raise MaterialError(where[other], f"a {other} needs a {role} too")
        try:
            value = data[role].decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise MaterialError(where[role], "not UTF-8 text (damaged?)") from None
        if not value:
            raise MaterialError(where[role], "is empty (incomplete?)")
        values[role] = value
    return BasicAuth(values["username"], values["password"])


def _token(data: Mapping[str, bytes], where: Mapping[str, str]) -> str | None:
    """A token file; its trailing line end is not part of the token, an empty file is a half-written one."""
    if "token" not in data:
        return None
    try:
        value = data["token"].decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise MaterialError(where["token"], "not UTF-8 text (damaged?)") from None
    if not value:
        raise MaterialError(where["token"], "is empty (incomplete?)")
    return value


def _undecorated(data: bytes, kind: str) -> bytes:
    """A JWT or seed file may be bare or armoured like a `.creds` file (the Go client's
    `UserCredentials(jwtFile, seedFile)` takes both, so Go-format configs may name either)."""
    blocks = {k.decode(): body for k, body in _BLOCK.findall(data)}
    return blocks.get(kind, data).strip()


def _identity(seed: bytes, seed_where: str, jwt: bytes | None, jwt_where: str | None) -> UserIdentity:
    import nkeys

    try:
        kp = nkeys.from_seed(bytearray(seed))
        public = kp.public_key.decode()
        kp.wipe()
    except (nkeys.NkeysError, ValueError, TypeError):  # its own, base32's and nacl's words for a bad seed
        raise MaterialError(seed_where, "not an nkey seed (incomplete or damaged?)") from None
    if not public.startswith("U"):
        raise MaterialError(seed_where, "is not a user nkey seed")
    if jwt is not None:
        subject = _jwt_subject(jwt, jwt_where or seed_where)
        if subject != public:
            raise MaterialError(jwt_where or seed_where, "the user JWT belongs to another nkey than the seed")
    return UserIdentity(bytes(seed), public, jwt)


def _jwt_subject(jwt: bytes, where: str) -> str:
    try:
        payload = jwt.split(b".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
        return str(claims["sub"])
    except (IndexError, ValueError, KeyError, TypeError, binascii.Error):
        raise MaterialError(where, "not a user JWT (incomplete or damaged?)") from None


# ---- files, watched ----

Stamp = tuple[object, ...]


def _stamp(path: str) -> Stamp:
    """What changes when a file is replaced or rewritten: its resolved path (kubelet's `..data`
    swap), inode, size and modification time."""
    try:
        st = os.stat(path)
    except OSError as err:
        return ("missing", err.errno)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(eq=False)
class MaterialSource:
    """The last good `Material` of one set of files; `current()` re-reads them when they change."""

    files: MaterialFiles
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _material: Material | None = field(default=None, repr=False)
    _stamps: dict[str, Stamp] = field(default_factory=dict, repr=False)
    _digests: dict[str, bytes] = field(default_factory=dict, repr=False)
    _failed: dict[str, Stamp] | None = field(default=None, repr=False)
    _first_error: MaterialError | None = field(default=None, repr=False)
    _checked_at: float = field(default=-math.inf, repr=False)

    def load(self) -> Material:
        """The material, loading it now if this is the first use; `MaterialError` if it never parsed."""
        material = self.current()
        if material is None:
            raise self._first_error or MaterialError(", ".join(self.files.paths().values()), "unusable")
        return material

    def current(self, max_age: float = 0.0) -> Material | None:
        """The newest material that parsed (checking the files first, unless they were checked less
        than `max_age` seconds ago), None if none ever did."""
        if time.monotonic() - self._checked_at >= max_age:
            self.check()
        return self._material

    def check(self) -> bool:
        """Re-read the files if they changed; True when new material replaced the old."""
        paths = self.files.paths()
        self._checked_at = time.monotonic()
        with self._lock:
            stamps = {role: _stamp(path) for role, path in paths.items()}
            if (self._material is not None and stamps == self._stamps) or stamps == self._failed:
                return False  # (a first check always builds: TLS with no files at all is material too)
            try:
                data = {role: _read(path) for role, path in paths.items()}
                digests = {role: hashlib.sha256(content).digest() for role, content in data.items()}
                if self._material is not None and digests == self._digests:
                    self._stamps, self._failed = stamps, None  # touched, copied or put back: same content
                    return False
                material = build(self.files, data)
            except MaterialError as err:
                self._fail(stamps, err)
                return False
            first = self._material is None
            changed = [paths[r] for r in paths if digests[r] != self._digests.get(r)]
            self._material, self._stamps, self._digests, self._failed = material, stamps, digests, None
        if not first:
            log.info("reloaded %s: the next (re)connect uses it%s", ", ".join(changed), _expiry(material))
        return True

    def _fail(self, stamps: dict[str, Stamp], err: MaterialError) -> None:
        self._failed = stamps
        if self._material is None:
            self._first_error = err
            return
        log.warning("%s; keeping the material loaded before, retrying when the files change", err)

    def not_after(self, role: CertificateRole) -> float:
        """For a gauge: NaN when there is no such certificate. A scrape of many workers' gauges
        looks at the files once a second at most."""
        material = self.current(max_age=1.0)
        value = material.not_after(role) if material else None
        return math.nan if value is None else value

    # The callbacks nats-py calls at every CONNECT: always the newest good material.
    def sign(self, nonce: str) -> bytes:
        user = self.load().user
        assert user is not None
        return user.sign(nonce)

    def user_jwt(self) -> bytearray:
        user = self.load().user
        assert user is not None
        return user.user_jwt()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as err:
        raise MaterialError(path, f"cannot be read ({err.strerror or err})") from None


def _expiry(material: Material) -> str:
    client = material.not_after("client")
    if client is None:
        return ""
    when = dt.datetime.fromtimestamp(client, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f" (client certificate valid until {when})"


_sources: dict[MaterialFiles, MaterialSource] = {}
_sources_lock = threading.Lock()


def source_for(files: MaterialFiles) -> MaterialSource:
    """One source per set of files in a process, so every connection that reads them (workers,
    control, KV, election) reloads together and logs a change once."""
    with _sources_lock:
        if files not in _sources:
            _sources[files] = MaterialSource(files)
        return _sources[files]
