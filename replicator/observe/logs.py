"""Logging set-up: text or JSON lines, to stdout or the configured file."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers; extra fields are not guessed at."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
          "error": logging.ERROR}


def setup_logging(*, debug: bool = False, logfile: str | None = None,
                  log_format: str = "text", level: str | None = None) -> None:
    """`level` is the config's `log_level` (the Go format's `loglevel`); `debug` wins over it."""
    level_no = logging.DEBUG if debug else LEVELS.get(level or "info", logging.INFO)
    handler: logging.Handler = logging.FileHandler(logfile) if logfile else logging.StreamHandler(sys.stdout)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_no)
    # The NATS client logs every reconnect attempt at error level; our callbacks say it once, better.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
