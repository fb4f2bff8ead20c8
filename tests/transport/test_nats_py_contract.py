"""nats-py's internals that this code relies on, named in one place, so that an upgrade fails here and
not in production.

The data plane goes past nats-py's public API where its per-message work would cost too much
(`transport/wire.py`: its parser, its write path; `transport/reads.py`: its TCP transport) and where
the public API has no door (`transport/connections.py`: credentials reloaded at every CONNECT).
pyproject.toml pins nats-py to the minor release these names were checked against. The tests prove
that (1) the code uses no private name of nats-py that is not declared below, (2) every declared one
still exists in the installed nats-py, with the signature the code calls or overrides, and (3) the
module globals the code replaces are still what nats-py reads.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import nats.aio.client
import nats.aio.subscription
import nats.aio.transport
import nats.js.client
import nats.js.manager
import nats.protocol.parser
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "replicator", ROOT / "operator"]
PINNED = "2.16"  # the minor release of nats-py whose internals are declared below

# nats-py's class -> the non-public attributes and methods of it the code uses, and where.
CONTRACT: dict[type, dict[str, str]] = {
    nats.aio.client.Client: {
        "_ps": "transport/wire.py: RawParser is put in place of the connection's parser",
        "_max_payload": "transport/wire.py, transport/jetstream.py, copier/pipeline.py: frames checked before sending",
        "_max_pending_size": "transport/wire.py: send_frames buffers during a reconnect as publish does",
        "_pending_data_size": "transport/wire.py: send_frames",
        "_send_command": "transport/wire.py: send_frames writes joined PUB/HPUB frames",
        "_flush_queue": "transport/wire.py: send_frames wakes the flusher as publish does",
        "_flush_pending": "transport/wire.py: send_frames",
        "_process_msg": "transport/wire.py: RawParser hands unregistered subscriptions back to nats-py",
        "_process_ping": "transport/wire.py: RawParser's control lines",
        "_process_pong": "transport/wire.py: RawParser's control lines",
        "_process_info": "transport/wire.py: RawParser's control lines",
        "_process_err": "transport/wire.py: RawParser's control lines; transport/connections.py overrides it",
        "_process_op_err": "transport/connections.py: reconnect when the server refuses the credentials",
        "_error_cb": "transport/connections.py: the error callback told why it reconnects",
        "_connect_command": "transport/connections.py: credentials read again at every CONNECT",
        "_current_server": "transport/connections.py: the server a CONNECT goes to",
        "_server_info": "transport/connections.py: whether the server requires TLS",
        "_auth_configured": "transport/connections.py: credentials from files at every CONNECT",
        "_signature_cb": "transport/connections.py",
        "_user_jwt_cb": "transport/connections.py",
        "_public_nkey": "transport/connections.py",
    },
    nats.aio.subscription.Subscription: {
        "_id": "transport/wire.py: raw subscriptions registered with RawParser by sid",
        "_pending_queue": "transport/jetstream.py: direct_subscribe hands messages to a callback",
    },
    nats.js.client.JetStreamContext: {"_nc": "transport/streams.py: the server version of a JetStream context"},
    nats.js.client.JetStreamContext.PullSubscription: {"_consumer": "copier/position.py: its consumer deleted"},
    nats.aio.transport.TcpTransport: {
        "_io_reader": "transport/reads.py: ChunkTransport reads through a ChunkReader",
        "_io_writer": "transport/reads.py",
        "_bare_io_reader": "transport/reads.py: kept as TcpTransport keeps them",
        "_bare_io_writer": "transport/reads.py",
    },
}
# Public-looking names of nats-py's protocol parser that RawParser reads to take over where it stopped.
PARSER_STATE = ("buf", "state", "msg_arg", "header_needed", "needed", "reset", "parse")
# The signatures the code calls or overrides: (class, method) -> its parameters after self.
SIGNATURES = {
    (nats.aio.client.Client, "_process_msg"): ["sid", "subject", "reply", "data", "headers"],
    (nats.aio.client.Client, "_send_command"): ["cmd", "priority"],
    (nats.aio.client.Client, "_flush_pending"): ["force_flush"],
    (nats.aio.client.Client, "_connect_command"): [],
    (nats.aio.client.Client, "_process_err"): ["err_msg"],
    (nats.aio.client.Client, "_process_op_err"): ["e"],
    (nats.aio.transport.TcpTransport, "connect"): ["uri", "buffer_size", "connect_timeout"],
    (nats.aio.transport.TcpTransport, "connect_tls"): ["uri", "ssl_context", "buffer_size", "connect_timeout"],
    (nats.protocol.parser.Parser, "__init__"): ["nc"],
    (nats.protocol.parser.Parser, "parse"): ["data"],
}


def nats_private_names() -> set[str]:
    """Every `_name` nats-py's source defines or reads: what counts as one of its internals."""
    root = Path(nats.__file__).parent
    names: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def nats_classes_in(tree: ast.Module) -> set[str]:
    """Names of the module's classes that derive from a nats-py class (their `self._x` is nats-py's)."""
    bases = {"Client", "TcpTransport", "Parser", "Subscription"}
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(ast.unparse(b).split(".")[-1] in bases for b in node.bases)}


def own_attributes(tree: ast.Module, class_name: str) -> set[str]:
    """What a class of ours assigns to itself: its own state, not nats-py's."""
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for node in ast.walk(cls):
        for target in node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]:
            for leaf in ast.walk(target) if target is not None else ():
                if isinstance(leaf, ast.Attribute) and ast.unparse(leaf.value) == "self":
                    own.add(leaf.attr)
    return own


def private_uses() -> Iterator[tuple[str, str]]:
    """(file, name) for every nats-py internal the code touches: `x._name` on a nats object, and
    `self._name` inside a subclass of a nats-py class (other than what the subclass sets itself)."""
    internals = nats_private_names()
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text())
            for class_name in nats_classes_in(tree):
                (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
                own = own_attributes(tree, class_name) - internals_assigned_by_nats(class_name)
                for node in ast.walk(cls):
                    if (isinstance(node, ast.Attribute) and node.attr in internals and node.attr not in own
                            and ast.unparse(node.value) in ("self", "super()")):
                        yield path.relative_to(ROOT).as_posix(), node.attr
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and node.attr in internals
                        and ast.unparse(node.value) not in ("self", "cls", "super()")
                        and node.attr != "_replace"):  # a namedtuple's, not nats-py's
                    yield path.relative_to(ROOT).as_posix(), node.attr


def internals_assigned_by_nats(class_name: str) -> set[str]:
    """The attributes nats-py's own base class assigns, which a subclass setting them takes over."""
    base = {"ChunkTransport": nats.aio.transport.TcpTransport, "_Client": nats.aio.client.Client,
            "RawParser": nats.protocol.parser.Parser}.get(class_name)
    return instance_names(base) if base is not None else set()


def instance_names(cls: type) -> set[str]:
    """What instances of a nats-py class have: its methods and what its code assigns to `self`."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != "nats":
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self":
                names.add(node.attr)
    return names


def test_nats_py_is_pinned_to_the_release_checked_here() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (spec,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("nats-py")]
    major, minor = (int(p) for p in PINNED.split("."))
    assert spec == f"nats-py>={PINNED},<{major}.{minor + 1}", spec
    installed = importlib.metadata.version("nats-py")
    assert installed.split(".")[:2] == PINNED.split("."), f"nats-py {installed} is installed, {PINNED} is declared"


def test_every_internal_of_nats_py_the_code_uses_is_declared() -> None:
    declared = {name for names in CONTRACT.values() for name in names}
    used = set(private_uses())
    undeclared = sorted(f"{path}: {name}" for path, name in used if name not in declared)
    assert not undeclared, "declare these in CONTRACT (and check them against nats-py):\n" + "\n".join(undeclared)
    stale = declared - {name for _, name in used}
    assert not stale, f"declared but no longer used: {sorted(stale)}"


@pytest.mark.parametrize(("cls", "name"), [(cls, name) for cls, names in CONTRACT.items() for name in names],
                         ids=lambda v: v.__qualname__ if isinstance(v, type) else str(v))
def test_each_declared_internal_exists_in_nats_py(cls: type, name: str) -> None:
    assert name in instance_names(cls), f"nats-py {importlib.metadata.version('nats-py')}: {cls.__qualname__} " \
                                        f"has no {name} any more ({CONTRACT[cls][name]})"


@pytest.mark.parametrize(("where", "parameters"), list(SIGNATURES.items()),
                         ids=[f"{c.__qualname__}.{m}" for c, m in SIGNATURES])
def test_the_signatures_called_or_overridden_are_unchanged(where: tuple[type, str], parameters: list[str]) -> None:
    cls, method = where
    found = list(inspect.signature(getattr(cls, method)).parameters)[1:]
    assert found == parameters, f"{cls.__qualname__}.{method}{tuple(found)}"


def test_the_parser_state_raw_parser_takes_over() -> None:
    parser = nats.protocol.parser.Parser(None)
    assert all(name in instance_names(nats.protocol.parser.Parser) for name in PARSER_STATE)
    assert isinstance(parser.buf, bytearray) and isinstance(parser.msg_arg, dict)
    assert hasattr(nats.protocol.parser, "AWAITING_MSG_PAYLOAD")
    source = inspect.getsource(nats.protocol.parser.Parser)
    assert all(f'self.msg_arg["{key}"]' in source for key in ("subject", "sid", "reply"))


def test_the_module_globals_the_code_replaces_are_what_the_client_reads() -> None:
    """transport/reads.py swaps `nats.aio.client.TcpTransport`, transport/wire.py raises
    `nats.aio.client.DEFAULT_BUFFER_SIZE`: both work only while the client looks them up at connect."""
    source = inspect.getsource(nats.aio.client.Client)
    assert "TcpTransport()" in source
    assert "DEFAULT_BUFFER_SIZE" in source and isinstance(nats.aio.client.DEFAULT_BUFFER_SIZE, int)
    assert "self._ps.parse(" in source  # the read loop feeds whatever parser `_ps` holds
