"""A Spark standalone cluster on loopback from the installed PySpark, and `spark-submit` to it.

The tests and `bench/fleet_health.py` run the job as the Spark operator does, on a real cluster: a
master and a worker in their own JVMs, executors started by the worker in theirs, each with its own
Python workers. Everything binds 127.0.0.1 on free ports (the web UIs included) and lives in one
directory; `close()` stops both daemons and their process groups, as `LocalNatsServer` does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

APP = Path(__file__).with_name("app.py")  # what MAIN_APPLICATION_FILE names inside the Spark image
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(RuntimeError):
    """The master or the worker did not come up."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """Environment for Spark daemons and spark-submit: this interpreter for Python, loopback only."""
    env = dict(os.environ if base is None else base)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
        **extra,
    })
    return env


@dataclass
class StandaloneSpark:
    """`spark://127.0.0.1:<port>` with one worker of `cores` cores."""

    cores: int = 2
    memory: str = "2g"
    directory: Path | None = None
    master_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _owned: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def work_dir(self) -> Path:
        assert self.directory is not None
        return self.directory / "work"

    def start(self, timeout: float = 90.0) -> StandaloneSpark:
        if self.directory is None:
            self._owned = tempfile.TemporaryDirectory(prefix="sr-spark-")
            self.directory = Path(self._owned.name)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        self.master_port, self._master_ui = _free_port(), _free_port()
        env = loopback_env(SPARK_LOG_DIR=str(self.directory), SPARK_WORKER_DIR=str(self.work_dir))
        self._spawn("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.master_port),
                               "--webui-port", str(self._master_ui)], env)
        try:
            self._wait(lambda status: status.get("status") == "ALIVE", timeout, "master")
            self._spawn("worker", [WORKER_CLASS, "--host", "127.0.0.1", "--port", str(_free_port()),
                                   "--webui-port", str(_free_port()), "--cores", str(self.cores),
                                   "--memory", self.memory, "--work-dir", str(self.work_dir), self.url], env)
            self._wait(lambda status: status.get("aliveworkers", 0) >= 1 and status.get("cores", 0) >= self.cores,
                       timeout, "worker")
        except BaseException:  # whatever stopped the start (Ctrl-C too): the processes started so far go
            self.close()
            raise
        return self

    def _spawn(self, role: str, arguments: list[str], env: dict[str, str]) -> None:
        assert self.directory is not None
        log = open(self.directory / f"{role}.log", "ab")
        try:
            self.processes[role] = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *arguments],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        finally:
            log.close()

    def status(self) -> dict[str, object]:
        """The master's own summary (`/json`): status, alive workers, cores, applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self._master_ui}/json/", timeout=2) as resp:
            return dict(json.load(resp))

    def _wait(self, ready: object, timeout: float, role: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise SparkClusterError(f"spark {name} exited: {self.log_tail(name)}")
            try:
                if ready(self.status()):  # type: ignore[operator]
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise SparkClusterError(f"spark {role} not ready after {timeout}s: {self.log_tail(role)}")

    def log_tail(self, role: str, lines: int = 20) -> str:
        path = (self.directory or Path(".")) / f"{role}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def logs(self) -> list[Path]:
        """Every log the cluster wrote: the daemons' and each executor's stdout/stderr."""
        if self.directory is None:
            return []
        return sorted(p for p in self.directory.rglob("*") if p.is_file() and (
            p.suffix == ".log" or p.name in ("stdout", "stderr")))

    def close(self) -> None:
        # The worker first: it stops its executors; then the master.
        for role in ("worker", "master"):
            process = self.processes.pop(role, None)
            if process is None or process.poll() is not None:
                continue
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self._owned is not None:
            self._owned.cleanup()
            self._owned = None
            self.directory = None

    def __enter__(self) -> StandaloneSpark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# Loopback, no UI, small memory: a test or bench driver beside a 2-core worker.
SUBMIT_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "768m",
    "spark.executor.memory": "1g",
    "spark.sql.shuffle.partitions": "2",
}


def submit_command(master: str, arguments: Sequence[str], conf: Mapping[str, str] | None = None,
                   app: Path = APP) -> list[str]:
    """`spark-submit` of the job's application file with the job's arguments, as the Spark operator runs it."""
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", master]
    for key, value in {**SUBMIT_CONF, **(conf or {})}.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(app), *arguments]


def submit(master: str, arguments: Sequence[str], conf: Mapping[str, str] | None = None,
           timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    """Run it to the end; stdout and stderr captured (the test reads them for secrets)."""
    return subprocess.run(submit_command(master, arguments, conf), env=loopback_env(), capture_output=True,
                          text=True, timeout=timeout, check=False)
