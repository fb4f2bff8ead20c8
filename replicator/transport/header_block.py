"""NATS header blocks as bytes (`NATS/1.0[ status]\\r\\nName: value\\r\\n...\\r\\n`).

The copy path passes blocks through as bytes; these helpers build one from a dict (messages the
replicator writes itself), read its status line, and give a read-only view that parses only
when asked, with nats-py's reading (names and values stripped, the last of a repeated name wins),
so sampling keys and checks see what they saw before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

HEAD = b"NATS/1.0"
CRLF = b"\r\n"
STATUS = "Status"
DESCRIPTION = "Description"


def encode(headers: Mapping[str, str] | None) -> bytes | None:
    """A block from name -> value (None when there is nothing to send)."""
    if not headers:
        return None
    return ("NATS/1.0\r\n" + "".join([f"{k}: {v}\r\n" for k, v in headers.items()]) + "\r\n").encode()


def status(block: bytes | None) -> tuple[int, str] | None:
    """(code, description) of an inline status (`NATS/1.0 408 Request Timeout`), else None."""
    if not block or len(block) < 12 or block[8] != 32:
        return None
    end = block.find(CRLF)
    line = block[9:end if end >= 0 else len(block)].strip()
    code, _, text = line.partition(b" ")
    if not code.isdigit():
        return None
    return int(code), text.strip().decode(errors="replace")


def _parse(block: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = block.split(CRLF)
    st = status(block)
    if st is not None:
        out[STATUS] = str(st[0])
        if st[1]:
            out[DESCRIPTION] = st[1]
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if not key or any(c.isspace() for c in key):
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


class HeaderView(Mapping[str, str]):
    """A header block read as a mapping; `get` of one name scans for it without parsing the rest."""

    __slots__ = ("_parsed", "block")

    def __init__(self, block: bytes) -> None:
        self.block = block
        self._parsed: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._parsed is None:
            self._parsed = _parse(self.block)
        return self._parsed

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        if self._parsed is not None or key in (STATUS, DESCRIPTION):
            return self._all().get(key, default)
        needle = key.encode()
        block = self.block
        found: bytes | None = None
        at = block.find(needle)
        while at >= 0:
            colon = block.find(b":", at + len(needle))
            line_start = block.rfind(b"\n", 0, at) + 1
            if line_start > 0 and colon >= 0 and not block[line_start:at].strip() and \
                    not block[at + len(needle):colon].strip():
                end = block.find(CRLF, colon)
                found = block[colon + 1:end if end >= 0 else len(block)]
            at = block.find(needle, at + len(needle))
        return default if found is None else found.strip().decode("utf-8", "replace")

    def may_hold(self, name: str) -> bool:
        """False when no line can carry `name` in any case: it appears nowhere in the block."""
        return name.lower().encode() in self.block.lower()

    def __getitem__(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"HeaderView({self._all()!r})"


def view(block: bytes | None) -> HeaderView | None:
    return HeaderView(block) if block else None
