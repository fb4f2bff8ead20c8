#!/usr/bin/env python3
"""Build and tag the `worker` and `spark` images (`make image`); see docs/images.md.

    python3 images/build.py [--tool auto|docker|buildah] [--base IMAGE|standin] [--repository REPO]
                            [--target worker|spark ...] [--no-pip-config]

The tool is docker when its engine answers, else buildah (`--isolation chroot`, `--layers`). The
base is the Dockerfile's PYTHON_IMAGE: python:3.11-slim-bookworm when it is local, else the stand-in
that images/bootstrap-base makes from Debian's packages when that is local, else the registry's
when it can be pulled, else a new stand-in (`--base standin` asks for the stand-in).

Builds on machines behind a package proxy need the machine's pip configuration and CA bundle. With
buildah they are mounted read-only into every RUN step, never copied into a layer: a temporary
directory is mounted over /root (which every base has, so no mount point is left behind) holding
`.config/pip/pip.conf` (the merged pip configuration: files and PIP_* variables), the CA bundle
and the constraint files it names, and each local directory the configuration points at (find-links, file:// indexes) is
mounted read-only below it. docker builds have no build-time mounts without BuildKit-only syntax,
so docker builds use pip's defaults. Standard library only: runs before any venv exists.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The image repository `make image` tags; the Helm chart's `image.repository` and the operator's
# default images (operator/model/images.py) name the same one, tests/packaging checks that they agree.
REPOSITORY = "ghcr.io/stream-replicator/stream-replicator"
REGISTRY_BASE = "python:3.11-slim-bookworm"
STANDIN_BASE = "localhost/stream-replicator-base:python3.11-bookworm"  # images/bootstrap-base's default
TARGETS = ("worker", "spark")
# Where the build's pip configuration appears inside RUN steps (root's home: see the docstring).
CONTAINER_HOME = "/root"
PIP_CONF = ".config/pip/pip.conf"
LOCAL_DIRS = ".pip-local"
# pip options whose values are local paths (files), lists of files, or lists of locations
# (directories, file:// URLs).
FILE_OPTIONS = ("cert", "client-cert")
FILE_LIST_OPTIONS = ("constraint",)
LOCATION_OPTIONS = ("find-links", "index-url", "extra-index-url")
# Set by the Dockerfile itself, or meaningless inside a build.
IGNORED_OPTIONS = ("config-file", "cache-dir", "no-cache-dir", "log", "target", "prefix", "root")


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def image_tags(repository: str = REPOSITORY, release: str | None = None) -> dict[str, str]:
    """Target -> image reference: `<repository>:<version>` and `<repository>:<version>-spark`."""
    release = release or version()
    return {"worker": f"{repository}:{release}", "spark": f"{repository}:{release}-spark"}


# ---- the machine's pip configuration ----------------------------------------------------------------


def pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's configuration files in the order pip reads them (later ones win)."""
    home = Path(env.get("HOME") or Path.home())
    xdg_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d] + [Path("/etc/pip.conf")]
    files += [home / ".pip" / "pip.conf", Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    if env.get("PIP_CONFIG_FILE") and env["PIP_CONFIG_FILE"] != os.devnull:
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def merged_pip_settings(files: Sequence[Path], env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Section -> option -> value, as pip would see them: files in order, then PIP_* variables."""
    merged: dict[str, dict[str, str]] = {}
    for path in files:
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        parser.read(path)
        for section in parser.sections():
            merged.setdefault(section, {}).update(parser.items(section))
    for key, value in env.items():
        if key.startswith("PIP_") and key != "PIP_CONFIG_FILE":
            merged.setdefault("global", {})[key[4:].lower().replace("_", "-")] = value
    for options in merged.values():
        for option in IGNORED_OPTIONS:
            options.pop(option, None)
    return {section: options for section, options in merged.items() if options}


def _local_path(location: str) -> Path | None:
    if location.startswith("file://"):
        return Path(location[len("file://") :])
    if location.startswith("/"):
        return Path(location)
    return None


@dataclass
class PipMounts:
    """What the build mounts: host path -> container path (all read-only), and the config text."""

    config: str
    files: dict[Path, str] = field(default_factory=dict)  # copied into the mounted home
    directories: dict[Path, str] = field(default_factory=dict)  # mounted below it


def plan_pip_mounts(
    settings: Mapping[str, Mapping[str, str]],
    system_ca: Path | None,
    exists: Callable[[Path], bool] = Path.exists,
    home: str = CONTAINER_HOME,
) -> PipMounts:
    """Rewrite the settings for the build container: files and local directories at container paths.

    The CA bundle pip uses is the configured `cert`, else the machine's bundle (`system_ca`): pip
    inside the image would otherwise trust only its own CA list, not the machine's. Local paths that
    do not exist here are left out (pip would only warn about them).
    """
    sections = {s: dict(o) for s, o in settings.items()}
    if system_ca is not None and not any("cert" in o for o in sections.values()):
        sections.setdefault("global", {})["cert"] = str(system_ca)
    files: dict[Path, str] = {}
    directories: dict[Path, str] = {}
    for options in sections.values():
        for option in FILE_OPTIONS + FILE_LIST_OPTIONS:
            if option not in options:
                continue
            value = options.pop(option)
            hosts = [Path(v) for v in value.split()] if option in FILE_LIST_OPTIONS else [Path(value)]
            paths = []
            for host in filter(exists, hosts):
                files.setdefault(host, f"{home}/{LOCAL_DIRS}/{option}-{len(files)}{host.suffix}")
                paths.append(files[host])
            if paths:
                options[option] = " ".join(paths)
        for option in LOCATION_OPTIONS:
            if option not in options:
                continue
            rewritten = []
            for location in options[option].split():
                path = _local_path(location)
                if path is None:
                    rewritten.append(location)
                    continue
                if not exists(path):
                    continue
                # An index's pages link to its files relatively (`../../files/...`): mount its parent.
                mount = path if option == "find-links" else path.parent
                mounted = directories.setdefault(mount, f"{home}/{LOCAL_DIRS}/{len(directories)}")
                if mount != path:
                    mounted = f"{mounted}/{path.name}"
                rewritten.append(f"file://{mounted}" if location.startswith("file://") else mounted)
            if rewritten:
                options[option] = " ".join(rewritten)
            else:
                del options[option]
    parser = configparser.RawConfigParser()
    for section, options in sections.items():
        parser[section] = options
    text = io.StringIO()
    parser.write(text)
    return PipMounts(text.getvalue(), files, directories)


def system_ca_bundle(env: Mapping[str, str]) -> Path | None:
    for candidate in (env.get("SSL_CERT_FILE"), env.get("REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@contextlib.contextmanager
def pip_volumes(env: Mapping[str, str]) -> Iterator[list[str]]:
    """buildah `--volume` arguments for the machine's pip configuration; the files go away afterwards."""
    plan = plan_pip_mounts(merged_pip_settings(pip_config_files(env), env), system_ca_bundle(env))
    with tempfile.TemporaryDirectory(prefix="sr-image-home-") as tmp:
        home = Path(tmp)
        (home / PIP_CONF).parent.mkdir(parents=True)
        (home / PIP_CONF).write_text(plan.config)
        (home / LOCAL_DIRS).mkdir()
        for host, container in plan.files.items():
            shutil.copyfile(host, home / Path(container).relative_to(CONTAINER_HOME))
        volumes = ["--volume", f"{home}:{CONTAINER_HOME}:ro"]
        for host, container in plan.directories.items():
            (home / Path(container).relative_to(CONTAINER_HOME)).mkdir()  # the mount point
            volumes += ["--volume", f"{host}:{container}:ro"]
        yield volumes


# ---- tools ------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], timeout: float | None = None, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), check=False, text=True, timeout=timeout, capture_output=quiet, stdin=subprocess.DEVNULL
    )


def docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return run(["docker", "info"], timeout=30, quiet=True).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def choose_tool(requested: str) -> str:
    if requested == "docker" or (requested == "auto" and docker_works()):
        return "docker"
    if shutil.which("buildah"):
        return "buildah"
    if requested == "buildah":
        raise SystemExit("image: buildah is not installed (apt-get install buildah)")
    raise SystemExit("image: needs a working docker engine or buildah (apt-get install buildah)")


def image_exists(tool: str, ref: str) -> bool:
    argv = ["buildah", "inspect", "--type", "image", ref] if tool == "buildah" else ["docker", "image", "inspect", ref]
    return run(argv, timeout=60, quiet=True).returncode == 0


def image_size(tool: str, ref: str) -> str:
    """The image's uncompressed size, as the tool prints it."""
    if tool == "buildah":
        return str(json.loads(run(["buildah", "images", "--json", ref], timeout=60, quiet=True).stdout)[0]["size"])
    size = int(run(["docker", "image", "inspect", "--format", "{{.Size}}", ref], timeout=60, quiet=True).stdout)
    return f"{size / 1e6:.0f} MB"


def resolve_base(tool: str, requested: str | None) -> str:
    if requested and requested != "standin":
        return requested
    if requested is None:
        if image_exists(tool, REGISTRY_BASE):
            return REGISTRY_BASE
        if image_exists(tool, STANDIN_BASE):
            log(f"using the stand-in {STANDIN_BASE} made earlier (--base {REGISTRY_BASE} tries the registry)")
            return STANDIN_BASE
        pull = ["buildah", "pull", "--quiet"] if tool == "buildah" else ["docker", "pull", "--quiet"]
        try:
            pulled = run([*pull, REGISTRY_BASE], timeout=600, quiet=True)
        except subprocess.TimeoutExpired:
            pulled = None
        if pulled is not None and pulled.returncode == 0:
            return REGISTRY_BASE
        reason = pulled.stderr.strip().splitlines()[-1] if pulled and pulled.stderr.strip() else "timed out"
        log(f"cannot pull {REGISTRY_BASE} ({reason}); using a stand-in made from Debian's packages")
    result = subprocess.run(
        [str(ROOT / "images" / "bootstrap-base"), "--tool", tool, "--tag", STANDIN_BASE],
        check=True,
        text=True,
        stdout=subprocess.PIPE,
    )
    return result.stdout.strip().splitlines()[-1]


def git_revision() -> str | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    head = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], timeout=30, quiet=True)
    if head.returncode != 0:
        return None
    dirty = run(["git", "-C", str(ROOT), "status", "--porcelain"], timeout=60, quiet=True).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def build_command(tool: str, target: str, tag: str, base: str, labels: Mapping[str, str]) -> list[str]:
    if tool == "buildah":
        isolation = os.environ.get("BUILDAH_ISOLATION") or "chroot"
        argv = ["buildah", "build", "--isolation", isolation, "--layers"]
    else:
        argv = ["docker", "build"]
    argv += ["--file", str(ROOT / "Dockerfile"), "--target", target, "--tag", tag]
    argv += ["--build-arg", f"PYTHON_IMAGE={base}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="images/build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    parser.add_argument("--base", default=None, help=f"base image (default {REGISTRY_BASE}, else the stand-in); "
                        "'standin' for the stand-in made by images/bootstrap-base")
    parser.add_argument("--repository", default=REPOSITORY, help="image repository (default %(default)s)")
    parser.add_argument("--target", action="append", choices=TARGETS, help="build only this target (repeatable)")
    parser.add_argument("--no-pip-config", action="store_true", help="do not pass the machine's pip configuration")
    args = parser.parse_args(argv)

    tool = choose_tool(args.tool)
    base = resolve_base(tool, args.base)
    tags = image_tags(args.repository)
    labels = {"org.opencontainers.image.version": version(), "org.opencontainers.image.base.name": base}
    revision = git_revision()
    if revision:
        labels["org.opencontainers.image.revision"] = revision
    log(f"building with {tool} on {base}")
    results = []
    with contextlib.ExitStack() as stack:
        volumes: list[str] = []
        if tool == "buildah" and not args.no_pip_config:
            volumes = stack.enter_context(pip_volumes(os.environ))
        elif tool == "docker" and not args.no_pip_config:
            log("docker: the machine's pip configuration is not passed (no build-time mounts); "
                "use --tool buildah where pip needs it")
        for target in args.target or TARGETS:
            start = time.monotonic()
            command = [*build_command(tool, target, tags[target], base, labels), *volumes, str(ROOT)]
            if run(command).returncode != 0:
                log(f"building {target} failed")
                return 1
            results.append((target, tags[target], time.monotonic() - start, image_size(tool, tags[target])))
    for target, tag, seconds, size in results:
        log(f"{target:6} {tag}  built in {seconds:.0f} s, {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
