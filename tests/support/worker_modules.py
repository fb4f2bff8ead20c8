"""Run the real command line in this process and, once its monitor says ready, write the modules
it imported (`sys.modules`, as JSON) and stop it with SIGTERM, as Kubernetes would.

`python -m tests.support.worker_modules PORT OUT -- ARGS...`: ARGS are the `stream-replicator`
arguments; PORT is the monitor port; OUT the file the module names go to.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(json.loads(resp.read()).get("ready"))
    except OSError:
        return False


def _watch(port: int, out: str) -> None:
    while not _ready(port):
        time.sleep(0.1)
    time.sleep(0.5)  # the first idle turns (a pull, a heartbeat of the copy loop) import nothing more
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    port, out, *args = sys.argv[1:]
    threading.Thread(target=_watch, args=(int(port), out), daemon=True).start()
    from replicator.cli.main import main as cli

    return cli(args[1:] if args[:1] == ["--"] else args)


if __name__ == "__main__":
    sys.exit(main())
