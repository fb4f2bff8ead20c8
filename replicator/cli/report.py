"""`stream-replicator report`: one row per topic, like `nats stream report`'s replication report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
from dataclasses import dataclass

from replicator.config.files import load_config
from replicator.config.model import Config, Profile
from replicator.copier.durable import OWNER_NOTE, WRITE_NOTE
from replicator.copier.loops import loop_notes
from replicator.copier.poison import stuck_notes
from replicator.transport.connections import connect_once, material_for
from replicator.transport.streams import find_source_stream


@dataclass
class ReportRow:
    topic: str
    source_stream: str = "-"
    target_stream: str = "-"
    consumer: str = "-"
    lag: int | None = None
    last_active: dt.datetime | None = None
    write: str = "-"  # how the worker writes to the target: batch or message (noted by the worker)
    loops: str = ""  # copies that would loop: skipped (active-active) or refused, noted by the workers
    error: str = ""
    certificate: tuple[float, str] | None = None  # the first certificate to expire: (notAfter, "side role")
    source_url: str = ""
    replicator_durables: tuple[str, ...] = ()  # every durable on the source stream a replicator created


def first_certificate(profile: Profile) -> tuple[float, str] | None:
    """The first of the profile's client and CA certificates to expire, from the files as they are now."""
    found = []
    for side in ("source", "target"):
        source = material_for(profile, side)  # type: ignore[arg-type]
        material = source.current() if source is not None else None
        for role in ("client", "ca"):
            not_after = material.not_after(role) if material is not None else None  # type: ignore[arg-type]
            if not_after is not None:
                found.append((not_after, f"{side} {role}"))
    return min(found) if found else None


async def report_row(profile: Profile, timeout: float = 5.0) -> ReportRow:
    row = ReportRow(profile.profile, consumer=profile.consumer_name, certificate=first_certificate(profile),
                    source_url=profile.settings.source_url)
    settings = profile.settings
    try:
        nc = await connect_once(profile, "source", f"{profile.base_name}_report", allow_reconnect=False,
                                max_reconnect_attempts=0, connect_timeout=timeout)
    except Exception as err:  # a row reports whatever kept its profile from being read; the others still print
        row.error = f"source unreachable: {err or type(err).__name__}"
        return row
    try:
        js = nc.jetstream(timeout=timeout)
        row.source_stream = await find_source_stream(js, settings)
        row.target_stream = settings.target_stream or row.source_stream
        row.replicator_durables = tuple(sorted(
            c.name for c in await js.consumers_info(row.source_stream)
            if c.config.durable_name and OWNER_NOTE in (c.config.metadata or {})))
        info = await js.consumer_info(row.source_stream, profile.consumer_name)
        row.lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
        row.last_active = info.delivered.last_active if info.delivered else None
        metadata = info.config.metadata or {}
        row.write = metadata.get(WRITE_NOTE, "-")
        row.loops = loop_notes(metadata)
        stuck = stuck_notes(metadata)
        if stuck:  # noted by the workers themselves: an error they cannot classify keeps failing
            row.error = f"stuck: {stuck}"
    except Exception as err:  # as above: the row says what went wrong
        row.error = str(err) or type(err).__name__
        if "consumer not found" in row.error.lower():
            row.error = "consumer not found: the replicator has not started yet"
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return row


def _ago(when: dt.datetime | None, now: dt.datetime) -> str:
    if when is None:
        return "never"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s ago"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m ago"


def _expiry(certificate: tuple[float, str] | None, now: dt.datetime) -> str:
    if certificate is None:
        return "-"
    not_after, which = certificate
    left = not_after - now.timestamp()
    if left <= 0:
        return f"EXPIRED ({which})"
    days, rest = divmod(int(left), 86400)
    return f"{days}d ({which})" if days else f"{rest // 3600}h{rest % 3600 // 60:02d}m ({which})"


def format_report(rows: list[ReportRow], now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.UTC)
    header = ("Topic", "Source Stream", "Target Stream", "Consumer", "Lag", "Last Active", "Writes", "Loops",
              "Cert Expiry", "Error")
    body = [
        (r.topic, r.source_stream, r.target_stream, r.consumer, "-" if r.lag is None else f"{r.lag:,}",
         _ago(r.last_active, now) if r.error == "" else "-", r.write, r.loops or "-", _expiry(r.certificate, now),
         r.error)
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |", line]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) + " |" for b in body]
    out.append(line)
    return "\n".join(out)


def unowned(rows: list[ReportRow]) -> list[str]:
    """Durables a replicator created on a source stream of these rows that no profile here owns
    (a profile renamed, switched between ordered and scaled, or removed): on interest or
    work-queue retention each holds the stream's messages."""
    owned = {(r.source_url, r.source_stream, r.consumer) for r in rows}
    return sorted({f"{r.source_stream}/{name}" for r in rows for name in r.replicator_durables
                   if (r.source_url, r.source_stream, name) not in owned})


async def build_report(config: Config, source: str, topics: list[str] | None = None) -> list[ReportRow]:
    names = topics or sorted(config.topics)
    return list(await asyncio.gather(*(report_row(Profile(config, n, source=source)) for n in names)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True)
    p.add_argument("--topic", action="append", help="only these profiles (repeatable)")


async def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    rows = await build_report(config, args.config, args.topic)
    print(format_report(rows))
    orphans = unowned(rows)
    if orphans:
        print(f"Durables no profile of {args.config} owns (delete each with `nats consumer rm STREAM NAME` unless "
              f"another replicator uses it): {', '.join(orphans)}")
    return 1 if any(r.error for r in rows) else 0
