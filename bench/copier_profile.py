"""Where the ordered copier's time goes: the real command under cProfile over a preloaded stream.

Run: `python -m bench.copier_profile` (not part of `make bench`: profiling slows the copier down,
so its rate is no benchmark). The profiler is switched on when the first copy lands (start-up and
imports excluded) and off at SIGTERM. Prints the top functions by own time, the view that shows
which per-message work dominates.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import connect, preload
from bench.sampling import preload_senders
from replicator.demo.local_nats import LocalNatsServer


async def profile(count: int, size: int, top: int, workdir: Path, extra: dict[str, Any], senders: int = 0) -> str:
    source = LocalNatsServer(name="source", store_dir=workdir / "src").start()
    target = LocalNatsServer(name="target", store_dir=workdir / "dst").start()
    try:
        src = await connect(source.url)
        dst = await connect(target.url)
        if senders:  # the sampling benchmark's fleet: `count` rounds over `senders` JSON registrations
            count = await preload_senders(src, senders, count)
        else:
            await preload(src, "FLEET", "fleet", count, size)
        topic = {"topic": "fleet.>", "source_url": source.url, "target_url": target.url, "name": "bench", **extra}
        config = workdir / "profile.yaml"
        config.write_text(yaml.safe_dump({"topics": {"bench": topic}}))
        out = workdir / "copier.prof"
        proc = subprocess.Popen([sys.executable, "-m", "bench.copier_profile", "--child", str(out),
                                 "--config", str(config), "--topic", "bench"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            seconds = await _fill(src if senders else dst, proc, count, consumed=bool(senders))
        finally:
            proc.terminate()
            proc.wait(60)
        await src.close()
        await dst.close()
    finally:
        source.close()
        target.close()
    text = io.StringIO()
    stats = pstats.Stats(str(out), stream=text)
    stats.sort_stats("tottime").print_stats(top)
    lines = [line for line in text.getvalue().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    header = f"{count:,} messages of {size} B in {seconds:.1f} s under the profiler ({count / seconds:,.0f} msgs/s)"
    return "\n".join([header, *(_short(line) for line in lines[start:])])


async def _fill(nc: Any, proc: subprocess.Popen[bytes], count: int, consumed: bool) -> float:
    """Seconds from the first copy (profiler switched on) to the last (`consumed`: from the first
    acknowledgement on the source to the last, when sampling leaves most messages uncopied)."""
    js = nc.jetstream()
    first = 0.0
    while True:
        try:
            if consumed:
                info = await js.consumer_info("FLEET", "bench")
                n = info.ack_floor.stream_seq if info.ack_floor else 0
            else:
                n = (await js.stream_info("FLEET")).state.messages
        except Exception:
            n = 0
        if n and not first:
            proc.send_signal(signal.SIGUSR1)
            first = time.monotonic()
        if n >= count:
            return time.monotonic() - first
        await asyncio.sleep(0.02)


def child(out: str, argv: list[str]) -> int:
    """The real command, with the profiler switched on by SIGUSR1 and written out at the end."""
    from replicator.cli.main import main as replicator_main

    prof = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
    try:
        return replicator_main(argv)
    finally:
        prof.disable()
        prof.dump_stats(out)


def _short(line: str) -> str:
    """Site-packages paths cut to the package, so the table fits a page."""
    for marker in ("site-packages/", "lib/python3."):
        at = line.find(marker)
        if at >= 0:
            head = line[:at]
            cut = head.rfind(" ")
            tail = line[at + len(marker):]
            if marker.startswith("lib/"):
                tail = tail.split("/", 1)[-1]
            return head[:cut + 1] + tail
    return line.replace(str(Path.cwd()) + "/", "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--fleet", type=int, default=0, metavar="SENDERS",
                        help="the sampling benchmark's fleet instead: --messages rounds over SENDERS senders")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra topic settings (YAML values), e.g. --set max_in_flight=2000")
    args = parser.parse_args(argv)
    extra = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    with tempfile.TemporaryDirectory(prefix="sr-profile-") as tmp:
        began = time.monotonic()
        print(asyncio.run(profile(args.messages, args.size, args.top, Path(tmp), extra, args.fleet)))
        print(f"(run took {time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
