"""Run the built images as Kubernetes would: podman with runc, from a pod spec's security settings.

podman's default runtime here (crun) refuses this machine's hybrid cgroup layout and rlimits it may
not raise, so containers run with `--runtime runc` and explicit ulimits no higher than the test's
own. Every container uses the host's network (the test's servers listen on 127.0.0.1), never pulls
(`--pull never`), and is removed afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def build_module() -> ModuleType:
    """images/build.py, which names the tags `make image` gives the images."""
    if "image_build" in sys.modules:
        return sys.modules["image_build"]
    spec = importlib.util.spec_from_file_location("image_build", REPO / "images" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_build"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class RunOptions:
    """How a container runs: user, filesystem, capabilities, mounts, environment."""

    user: str = "10001:10001"
    read_only: bool = True
    cap_drop_all: bool = True
    no_new_privileges: bool = True
    entrypoint: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)  # (host, container, read-only)
    tmpfs: list[str] = field(default_factory=list)


def pod_options(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> RunOptions:
    """The podman options a Kubernetes pod spec's security settings and emptyDirs mean.

    Mounts of ConfigMaps and Secrets are the caller's: it writes their files and adds them.
    """
    pod_security = pod_spec.get("securityContext") or {}
    security = {**pod_security, **(container.get("securityContext") or {})}
    uid = security.get("runAsUser")
    gid = security.get("runAsGroup", uid)
    assert uid is not None, "the pod spec names no user: the image's USER would apply"
    empty_dirs = {v["name"] for v in pod_spec.get("volumes") or [] if "emptyDir" in v}
    return RunOptions(
        user=f"{uid}:{gid}",
        read_only=bool(security.get("readOnlyRootFilesystem")),
        cap_drop_all="ALL" in ((security.get("capabilities") or {}).get("drop") or []),
        no_new_privileges=security.get("allowPrivilegeEscalation") is False,
        entrypoint=list(container["command"]) if container.get("command") else None,
        tmpfs=[m["mountPath"] for m in container.get("volumeMounts") or [] if m["name"] in empty_dirs],
    )


class Container:
    """A running `podman run` process, its log, and its name for `podman kill`/`exec`."""

    def __init__(self, podman: Podman, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.podman, self.name, self.proc, self.log = podman, name, proc, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def exec(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.podman.command(["exec", self.name, *argv], timeout=timeout)

    def terminate(self) -> None:
        """SIGTERM to the container's first process, as the kubelet sends it."""
        self.podman.command(["kill", "--signal", "TERM", self.name], timeout=60)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


class Podman:
    """podman with runc; None from `find()` when either is missing."""

    def __init__(self, podman: str, runc: str) -> None:
        self.podman, self.runc = podman, runc
        nofile_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.ulimits = [f"nofile={nofile_soft}:{nofile_soft}", "nproc=4096:4096"]

    @classmethod
    def find(cls) -> Podman | None:
        podman, runc = shutil.which("podman"), shutil.which("runc")
        return cls(podman, runc) if podman and runc else None

    def command(
        self, argv: Sequence[str], timeout: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.podman, "--runtime", self.runc, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert result.returncode == 0, f"podman {' '.join(argv)}: {result.stderr}"
        return result

    def exists(self, image: str) -> bool:
        return self.command(["image", "exists", image], timeout=60).returncode == 0

    def inspect(self, image: str) -> dict[str, Any]:
        return dict(json.loads(self.command(["image", "inspect", image], check=True).stdout)[0])

    def run_argv(self, image: str, args: Sequence[str], options: RunOptions, name: str) -> list[str]:
        argv = [self.podman, "--runtime", self.runc, "run", "--rm", "--name", name, "--pull", "never"]
        argv += ["--network", "host", "--user", options.user]
        argv += [f"--ulimit={u}" for u in self.ulimits]
        if options.read_only:
            # Only what the pod mounts is writable: no tmpfs of podman's own on /tmp, /run, /var/tmp.
            argv += ["--read-only", "--read-only-tmpfs=false"]
        if options.cap_drop_all:
            argv += ["--cap-drop", "ALL"]
        if options.no_new_privileges:
            argv += ["--security-opt", "no-new-privileges"]
        for path in options.tmpfs:
            argv += ["--tmpfs", f"{path}:rw,mode=1777"]
        for host, container, read_only in options.mounts:
            argv += ["--volume", f"{host}:{container}:{'ro' if read_only else 'rw'}"]
        for key, value in options.env.items():
            argv += ["--env", f"{key}={value}"]
        if options.entrypoint is not None:
            argv += ["--entrypoint", json.dumps(options.entrypoint[:1])]
            args = [*options.entrypoint[1:], *args]
        return [*argv, image, *args]

    @contextlib.contextmanager
    def start(self, image: str, args: Sequence[str], options: RunOptions, log: Path) -> Iterator[Container]:
        """A container running in the background; killed and removed when the block ends."""
        name = f"sr-test-{uuid.uuid4().hex[:10]}"
        with open(log, "wb") as out:
            argv = self.run_argv(image, args, options, name)
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield Container(self, name, proc, log)
        finally:
            if proc.poll() is None:
                self.command(["kill", "--signal", "KILL", name], timeout=60)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.command(["rm", "--force", "--ignore", name], timeout=60)

    def run(
        self, image: str, args: Sequence[str], options: RunOptions, log: Path, timeout: float
    ) -> tuple[int, str]:
        """Run to completion (bounded): exit status and output."""
        with self.start(image, args, options, log) as container:
            try:
                code = container.wait(timeout)
            except subprocess.TimeoutExpired as err:
                output = container.output()[-4000:]
                raise AssertionError(f"{args[:2]} still running after {timeout} s:\n{output}") from err
            return code, container.output()

    def layers(self, image: str, dest: Path) -> list[Path]:
        """The image's layers as uncompressed tar files, lowest first (`podman save` to an OCI dir)."""
        self.command(["save", "--format", "oci-dir", "--uncompressed", "--output", str(dest), image],
                     timeout=600, check=True)
        index = json.loads((dest / "index.json").read_text())
        digest = index["manifests"][0]["digest"]
        manifest = json.loads(_blob(dest, digest).read_text())
        return [_blob(dest, layer["digest"]) for layer in manifest["layers"]]


def _blob(root: Path, digest: str) -> Path:
    algorithm, value = digest.split(":", 1)
    return root / "blobs" / algorithm / value


def layer_files(layer: Path) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    with tarfile.open(layer) as tar:
        for member in tar:
            yield member, tar


def writable_by(path: Path, uid: int = 10001) -> Path:
    """A host directory the container's user may write to (the test runs as root)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    return path

