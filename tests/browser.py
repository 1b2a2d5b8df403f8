"""A real headless Chromium driven over its DevTools protocol (aiohttp's WebSocket client):
open a page, evaluate JavaScript in it, wait for a condition with a deadline, answer a
`confirm()` dialog. The browser reaches nothing but 127.0.0.1 and is stopped by its
process group."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from web_helpers import CHROMIUM_QUIET


class Page:
    """One tab: `call` a DevTools method, `value` of an expression, `until` one is truthy;
    `dialogs` holds the messages of the dialogs the page opened, each answered `answer`."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.dialogs: list[str] = []
        self.answer = False
        self._answers: list[asyncio.Future[dict[str, Any]]] = []
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self._waiting:
                self._waiting.pop(data["id"]).set_result(data)
            elif data.get("method") == "Page.javascriptDialogOpening":
                self.dialogs.append(data["params"]["message"])
                answer = self.call("Page.handleJavaScriptDialog", accept=self.answer)
                self._answers.append(asyncio.ensure_future(answer))

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = done
        await self.ws.send_str(json.dumps({"id": self._next, "method": method, "params": params}))
        got = await asyncio.wait_for(done, 60)
        if "error" in got:
            raise AssertionError(f"{method}: {got['error']}")
        return got.get("result", {})

    async def value(self, expression: str) -> Any:
        got = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in got:
            raise AssertionError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")

    async def until(self, expression: str, timeout: float, what: str) -> Any:
        """The expression's first truthy value, polled every 20 ms; fails at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            found = await self.value(expression)
            if found:
                return found
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def chromium(tmp: Path) -> AsyncIterator[Page]:
    """A headless Chromium with one blank tab, over DevTools; killed (its group) after."""
    import aiohttp

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is needed (apt-get install chromium)")
    argv = [
        binary,
        *CHROMIUM_QUIET,
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        port = await asyncio.to_thread(_devtools_port, proc)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                tabs = await resp.json()
            tab = next(t for t in tabs if t.get("type") == "page")
            async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Runtime.enable")
                yield page
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _devtools_port(proc: subprocess.Popen[bytes]) -> int:
    """The port Chromium prints (`DevTools listening on ws://127.0.0.1:PORT/...`)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode("utf-8", "replace")
        if not line and proc.poll() is not None:
            break
        found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # never blocks it
            return int(found.group(1))
    pytest.fail("chromium did not say where its DevTools listen")
