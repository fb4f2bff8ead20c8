"""NATS URL lists and the connection options their query strings carry (the Go replicator's form).

`nats://host:4222?credentials=/etc/sr.creds&connect_timeout=5s` is how the Go Stream Replicator
(0.9) configures a connection, and it works in both config formats here. As there, the options
come from the first URL that has a query string and apply to the whole list; every URL is dialled
without its query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

from replicator.config.durations import parse_go_duration

QUERY_OPTIONS = ("credentials", "jwt", "nkey", "tls_handshake_first", "insecure", "connect_timeout")
_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


Userinfo = Literal["user:password", "token"]
"""Credentials written into the URLs themselves (`user:password@`, `token@`)."""


@dataclass(frozen=True)
class UrlOptions:
    """What a side's URL list asks for besides the servers."""

    servers: tuple[str, ...]
    credentials: str | None = None
    jwt: str | None = None
    nkey: str | None = None
    tls_handshake_first: bool = False
    insecure: bool = False
    connect_timeout: float | None = None
    # Credentials written into the URLs themselves (`user:password@`, `token@`): a way to
    # authenticate, but one that anyone who reads the config or the command line reads too.
    userinfo: Userinfo | None = None


def split_urls(value: str) -> list[str]:
    return [u.strip() for u in value.split(",") if u.strip()]


def _bool(name: str, values: list[str]) -> bool:
    """Go's strconv.ParseBool words; the Go tool reads anything else as false, we say so instead."""
    text = values[-1].strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"URL option {name}={values[-1]!r} is not true or false")


def url_userinfo(value: str) -> Userinfo | None:
    """What credentials the URLs carry themselves; None also for URLs that cannot be read (whatever
    uses them names that problem)."""
    try:
        return url_options(value).userinfo
    except ValueError:
        return None


def url_options(value: str) -> UrlOptions:
    """The servers without query strings and the options of the first query; ValueError when wrong."""
    servers: list[str] = []
    query: dict[str, list[str]] | None = None
    userinfo: Userinfo | None = None
    for url in split_urls(value):
        parts = urlsplit(url)
        if parts.query and query is None:
            query = parse_qs(parts.query, keep_blank_values=True)
        if (parts.username or parts.password) and userinfo != "user:password":
            userinfo = "user:password" if parts.password is not None else "token"
        servers.append(urlunsplit(parts._replace(query="", fragment="")))
    if not query:
        return UrlOptions(tuple(servers), userinfo=userinfo)
    unknown = sorted(set(query) - set(QUERY_OPTIONS))
    if unknown:
        raise ValueError(f"unknown URL option {', '.join(unknown)} (known: {', '.join(QUERY_OPTIONS)})")

    def text(name: str) -> str | None:
        values = query.get(name)
        return values[-1].strip() or None if values else None

    jwt, nkey = text("jwt"), text("nkey")
    if bool(jwt) != bool(nkey):
        raise ValueError("URL options jwt and nkey go together (a user JWT file and its nkey seed file)")
    creds = text("credentials")
    if creds and jwt:
        raise ValueError("URL options credentials and jwt/nkey are alternatives: use one")
    timeout = None
    if "connect_timeout" in query:
        try:
            timeout = parse_go_duration(text("connect_timeout") or "")
        except ValueError as err:
            raise ValueError(f"URL option connect_timeout: {err}") from None
        if timeout <= 0:
            raise ValueError("URL option connect_timeout must be a positive duration such as 5s")
    return UrlOptions(
        tuple(servers),
        credentials=creds,
        jwt=jwt,
        nkey=nkey,
        tls_handshake_first="tls_handshake_first" in query and _bool("tls_handshake_first",
                                                                     query["tls_handshake_first"]),
        insecure="insecure" in query and _bool("insecure", query["insecure"]),
        connect_timeout=timeout,
        userinfo=userinfo,
    )
