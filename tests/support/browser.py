"""Open a local page in headless Chromium (Debian's `chromium`) and report what a person would see.

Driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`: fd 3 in, fd 4 out), so
no port is opened. Every request the page makes, every console message and uncaught exception is
recorded, and the screenshot is taken by the browser itself. Name resolution is switched off
(`--host-resolver-rules`) and Chromium's own background traffic disabled: nothing leaves the
machine even if a page tried.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-default-apps", "--disable-extensions", "--no-pings",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--metrics-recording-only",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", "--mute-audio",
]


@dataclass
class PageVisit:
    """What happened while the page loaded and rendered."""

    screenshot: bytes = b""
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, its own included
    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    exceptions: list[str] = field(default_factory=list)
    title: str = ""

    @property
    def errors(self) -> list[str]:
        return [*(f"console {lvl}: {text}" for lvl, text in self.console if lvl in ("error", "assert")),
                *(f"exception: {e}" for e in self.exceptions)]

    @property
    def remote_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.ids = proc, os.fdopen(to_browser, "wb", buffering=0), 0
        self.replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, args=(os.fdopen(from_browser, "rb", buffering=0),),
                                       daemon=True)
        self.reader.start()

    def _read(self, stream: Any) -> None:
        buffer = b""
        while chunk := stream.read(65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    self.replies.setdefault(message["id"], queue.Queue()).put(message)
                else:
                    self.events.put(message)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self.ids += 1
        ident = self.ids
        reply = self.replies.setdefault(ident, queue.Queue())
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.out.write(json.dumps(message).encode() + b"\0")
        answer = reply.get(timeout=timeout)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return dict(answer.get("result") or {})


def visit(path: Path, *, width: int = 1280, height: int = 1600, settle: float = 1.5, timeout: float = 60) -> PageVisit:
    """Load `path` as a file:// URL, let it render for `settle` seconds after its load event, screenshot it."""
    assert CHROMIUM, "chromium is not installed"
    result = PageVisit()
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def wire() -> None:  # in the child: the protocol's fds 3 and 4, open across exec
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]  # clear of 3 and 4
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    with tempfile.TemporaryDirectory(prefix="sr-chromium-") as profile, \
            open(Path(profile) / "stderr.log", "wb") as log:
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}/data", "about:blank"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=wire, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(proc, to_browser_w, from_browser_r)
        try:
            target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
            session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.call(f"{domain}.enable", session)
            pipe.call("Emulation.setDeviceMetricsOverride", session, width=width, height=height,
                      deviceScaleFactor=1, mobile=False)
            pipe.call("Page.navigate", session, url=path.resolve().as_uri())
            loaded_at = None
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and (loaded_at is None or time.monotonic() < loaded_at + settle):
                try:
                    event = pipe.events.get(timeout=0.1)
                except queue.Empty:
                    continue
                _record(result, event)
                if event.get("method") == "Page.loadEventFired":
                    loaded_at = time.monotonic()
            assert loaded_at is not None, "the page never finished loading"
            result.title = str(pipe.call("Runtime.evaluate", session, expression="document.title")["result"]
                               .get("value", ""))
            shot = pipe.call("Page.captureScreenshot", session, format="png")
            result.screenshot = base64.b64decode(shot["data"])
            while not pipe.events.empty():
                _record(result, pipe.events.get_nowait())
            pipe.call("Browser.close")
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=15)
            pipe.out.close()
    return result


def _record(result: PageVisit, event: dict[str, Any]) -> None:
    method, params = event.get("method"), event.get("params") or {}
    if method == "Network.requestWillBeSent":
        result.requests.append(str(params["request"]["url"]))
    elif method == "Runtime.consoleAPICalled":
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args") or [])
        result.console.append((str(params.get("type")), text))
    elif method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails") or {}
        result.exceptions.append(str((details.get("exception") or {}).get("description") or details.get("text")))
    elif method == "Log.entryAdded":
        entry = params.get("entry") or {}
        result.console.append((str(entry.get("level")), f"{entry.get('source')}: {entry.get('text')}"))
