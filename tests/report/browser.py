"""Load a page in headless Chromium and report what a reader's browser would: console errors,
uncaught exceptions, failed loads, broken images, and a full-page screenshot.

Why the DevTools protocol over ``--remote-debugging-pipe`` (not ``--screenshot`` plus log
scraping): the pipe needs no port, no websocket library and no network, and it reports console
messages, exceptions and failed resource loads as structured events instead of log lines whose
format changes between Chromium versions. Messages are JSON objects separated by NUL bytes;
Chromium reads commands on fd 3 and writes replies and events on fd 4.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")


_TRAMPOLINE = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
               "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageResult:
    console_errors: list[str] = field(default_factory=list)  # console.error/assert, exceptions, failed loads
    images: dict = field(default_factory=dict)  # {"count", "broken", "external"}
    screenshot_png: bytes = b""
    title: str = ""


class _Pipe:
    def __init__(self, exe: str, user_data_dir: str, timeout_s: float):
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        # Chromium's ends go to fds >= 10 first, so that moving them to 3 and 4 in the child can
        # never overwrite one with the other; a tiny Python trampoline then places them and execs.
        high_r, high_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(res_w)
        cmd_r, res_w = high_r, high_w
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _TRAMPOLINE, str(cmd_r), str(res_w), exe, *FLAGS,
             f"--user-data-dir={user_data_dir}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(cmd_r, res_w))
        os.close(cmd_r)
        os.close(res_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.deadline = time.monotonic() + timeout_s

    def _read_message(self) -> dict:
        while b"\0" not in self._buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the DevTools pipe: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read_message()
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._res_r)
        if self.proc.stderr:
            self.proc.stderr.close()


_IMAGES_JS = """JSON.stringify({
  count: document.images.length,
  broken: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).length,
  external: performance.getEntriesByType('resource').map(r => r.name)
            .filter(n => !n.startsWith('data:') && !n.startsWith('file:')),
})"""


def load_page(exe: str, path: Path, *, width: int = 1280, timeout_s: float = 60.0) -> PageResult:
    """Open ``path`` (file://), wait for its load event, collect errors and a full-page screenshot."""
    with tempfile.TemporaryDirectory(prefix="taxmodel-chromium-") as profile:
        pipe = _Pipe(exe, profile, timeout_s)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
            pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            pipe.wait_event("Page.loadEventFired")
            result = PageResult()
            result.images = json.loads(pipe.send("Runtime.evaluate", {"expression": _IMAGES_JS, "returnByValue": True},
                                                 session=session)["result"]["value"])
            result.title = pipe.send("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                                     session=session)["result"]["value"]
            size = pipe.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            shot = pipe.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": min(size["height"], 16000), "scale": 1}},
                session=session)
            result.screenshot_png = base64.b64decode(shot["data"])
            result.console_errors = _errors(pipe.events)
            return result
        finally:
            pipe.close()


def _errors(events: list[dict]) -> list[str]:
    out = []
    for ev in events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            out.append(f"exception: {details.get('text', '')} {details.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
    return out
