"""A quiet driver JVM for people at a terminal: Spark's start-up noise is dropped, the rest kept.

PySpark starts the driver JVM with the terminal as its stderr, so every run of the CLI or the demo
opens with JVM warnings, the log4j banner and `WARN NativeCodeLoader`. Here the JVM is launched
with its stderr on a pipe that a thread forwards line by line, dropping only those known lines:
errors, Python worker tracebacks and warnings from the run itself still reach the terminal.
Used only where this process starts the JVM (a local master); under spark-submit it already runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import IO, Any

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway

# What a healthy start prints and nobody needs: JVM launcher warnings ("WARNING: Using incubator
# modules ..."), the default log4j profile banner and its hints, and Hadoop's missing native library.
NOISE = re.compile(
    r"^(WARNING: |Using Spark's default log4j profile|Setting default log level to"
    r"|To adjust logging level use sc\.setLogLevel"
    r"|\S+ \S+ WARN NativeCodeLoader: Unable to load native-hadoop library)"
)


def is_noise(line: str) -> bool:
    return NOISE.match(line) is not None


def _forward(source: IO[bytes]) -> None:
    for raw in iter(source.readline, b""):
        line = raw.decode("utf-8", "replace")
        if not is_noise(line):
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone (the process is exiting)
                return


def launch_quietly(builder: Any) -> None:
    """Start the driver JVM for `builder` (a `SparkSession.Builder`) with its start-up noise filtered;
    nothing to do when a JVM is already there (an earlier session, or spark-submit's)."""
    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf(loadDefaults=False)
    # The options `getOrCreate` would pass to spark-submit itself: memory, packages and Java options
    # must be given at launch.
    for key, value in getattr(builder, "_options", {}).items():
        conf.set(key, str(value))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    proc = gateway.proc
    if proc is not None and proc.stderr is not None:
        threading.Thread(target=_forward, args=(proc.stderr,), name="spark-stderr", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)
