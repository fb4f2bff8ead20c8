"""A container started as a Deployment says, as a local process: the command from the venv's entry
points (the image's PATH holds the same ones), the args and env from the manifest (`fieldRef`s
resolved as the kubelet resolves them), and a log file. No test-only entry point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def executable(command: str) -> str:
    """The venv's entry point of a container command (`stream-replicator`, `...-operator`)."""
    path = Path(sys.prefix) / "bin" / command
    if not path.exists():
        raise FileNotFoundError(f"the container command {command!r} is no entry point of {sys.prefix}")
    return str(path)


def container_env(container: dict[str, Any], pod: dict[str, str]) -> dict[str, str]:
    """The container's env: values as given, `fieldRef`s from the pod's metadata (name, namespace)."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        ref = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if ref is not None:
            env[var["name"]] = {"metadata.name": pod["name"], "metadata.namespace": pod["namespace"]}[ref]
        elif "valueFrom" in var:
            raise ValueError(f"unsupported env source for {var['name']}: {var['valueFrom']}")
        else:
            env[var["name"]] = str(var.get("value", ""))
    return env


def argv_of(container: dict[str, Any], rewrite: dict[str, str] | None = None) -> list[str]:
    command = list(container["command"])
    args = [(rewrite or {}).get(a, a) for a in container.get("args") or []]
    return [executable(command[0]), *command[1:], *args]


class Process:
    """One started container; `stop` sends SIGTERM (the kubelet's) then SIGKILL after the grace period."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.argv, self.log_path = argv, log
        log.parent.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SSL_CERT_FILE")}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, env={**base, **env}, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=cwd)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self, grace: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)
