"""Headless Chromium driven over its DevTools protocol (a websocket of JSON commands), for page tests.

Debian's ``chromium`` package (installed by ``.ci/run`` when missing) is started as a real
process with ``--remote-debugging-port=0``; the port it chose is read from the
``DevToolsActivePort`` file it writes into its profile folder, and the page target's
websocket is driven with aiohttp's client: navigate, evaluate JavaScript, take screenshots.
Without chromium the test is skipped on a developer machine and failed in CI (``services.unavailable``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from services import unavailable

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """The chromium executable, or skip/fail the test when there is none."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    unavailable("chromium", "no chromium on PATH (apt-get install chromium)")


class Page:
    """One browser tab: commands go out with ids, replies are matched to them, events are ignored."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result.

        Raises:
            RuntimeError: the browser answered with an error.
        """
        command_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": command_id, "method": method, "params": params}))
        while True:
            message = await self._ws.receive_json(timeout=30)
            if message.get("id") == command_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def goto(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)

    async def wait_for(self, expression: str, *, timeout_s: float = 20.0) -> Any:
        """Evaluate ``expression`` every 100 ms until it is truthy; return its value.

        Raises:
            TimeoutError: still falsy after ``timeout_s`` (the page's text is in the message).
        """
        deadline = time.monotonic() + timeout_s
        guarded = f"(() => {{ try {{ return ({expression}); }} catch (e) {{ return null; }} }})()"
        while True:
            value = await self.evaluate(guarded)
            if value:
                return value
            if time.monotonic() > deadline:
                text = await self.evaluate("document.body ? document.body.innerText.slice(0, 2000) : ''")
                raise TimeoutError(f"{expression!r} still falsy after {timeout_s} s; the page shows:\n{text}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> Path:
        """Save a PNG of the whole page at ``path``."""
        metrics = await self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = await self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        )
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))
        return path


def _launch(executable: str, profile: Path, width: int, height: int) -> subprocess.Popen[bytes]:
    """Start headless chromium on a fresh profile folder, its DevTools on a free local port."""
    profile.mkdir(parents=True, exist_ok=True)
    command = [
        executable,
        "--headless",
        "--no-sandbox",  # CI runs as root, where chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--remote-debugging-port=0",
        "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    with open(profile / "stderr.log", "wb") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


@contextlib.asynccontextmanager
async def chromium_page(profile: Path, *, width: int = 1400, height: int = 1000) -> AsyncIterator[Page]:
    """Start headless chromium with a fresh profile under ``profile``; yield its first tab; kill it after."""
    process = _launch(chromium_path(), profile, width, height)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                log = (profile / "stderr.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"chromium did not start (exit {process.poll()}): {log}")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as reply:
                targets = await reply.json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with session.ws_connect(url, max_msg_size=0) as ws:
                page = Page(ws)
                await page.call(
                    "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
                )
                yield page
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(profile, ignore_errors=True)
