"""stream-replicator: NATS JetStream stream replication (the data plane, its CLI, fleet health)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

DISTRIBUTION = "stream-replicator"


def version() -> str:
    """The installed distribution's version, for `--version` (read lazily: importlib.metadata pulls
    in modules a worker does not otherwise load)."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown (not installed)"


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """`--version`: prints `<prog> <version>` and exits 0; the version is only read when asked."""
    import argparse

    class Version(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
            print(f"{parser.prog} {version()}")  # stdout, as argparse's own version action
            parser.exit(0)

    parser.add_argument("--version", nargs=0, action=Version, help="print the version and exit")
