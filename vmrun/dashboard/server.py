"""Serving the dashboard: the `dashboard` extra checked, one connection pool for the whole
server (one SSH connection per host), the address printed with its token, and the server
until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Callable
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from aiohttp import web

    from vmrun.dashboard.access import Access
    from vmrun.dashboard.views import Views

DEFAULT_PORT = 8777  # taken already: any free port (a port the user named: an error)


def check_extra() -> None:
    """aiohttp is there, else one line naming the extra."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise UsageError(
            "`vmrun dashboard` needs aiohttp, which is not installed here",
            hint="pip install 'vmrun[dashboard]'",
            code="dashboard-extra-missing",
        ) from None


def serve(
    settings: Settings,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    port: int | None = None,
    bind: str = "127.0.0.1",
    opened: Callable[[str], None],
    store: str | None = None,
) -> None:
    """Serve until Ctrl-C (or the task is cancelled). `opened` is told the page's address,
    token included, once it listens. `store`: a bucket place whose runs are listed too
    (None: vmrun.toml's `store`, where it has one)."""
    check_extra()
    from vmrun.dashboard.access import Access
    from vmrun.dashboard.views import Views
    from vmrun.ssh import pool

    access = Access()
    with pool.holding():
        views = Views(settings, hosts=hosts, cluster=cluster, store=store)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the end asked for
            asyncio.run(_serve(views, access, bind, port, opened))


async def _serve(
    views: Views, access: Access, bind: str, port: int | None, opened: Callable[[str], None]
) -> None:
    from aiohttp import web

    from vmrun.dashboard.app import make_app

    runner = web.AppRunner(make_app(views, access), access_log=None)
    await runner.setup()
    warming = None
    try:
        await _listen(runner, bind, port)
        warming = asyncio.get_running_loop().run_in_executor(None, views.warm)
        bound = runner.addresses[0][1]
        host = f"[{bind}]" if ":" in bind else bind
        opened(f"http://{host}:{bound}/?token={access.token}")
        await asyncio.Event().wait()  # until Ctrl-C
    finally:
        if warming is not None:
            warming.cancel()
        await runner.cleanup()


async def _listen(runner: web.AppRunner, bind: str, port: int | None) -> None:
    """On `port`; with none, on DEFAULT_PORT where it is free, else on any free port."""
    from aiohttp import web

    for tried in [DEFAULT_PORT, 0] if port is None else [port]:
        try:
            await web.TCPSite(runner, bind, tried).start()
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if port is None:
                continue
    raise UsageError(
        f"port {port} is in use here",
        hint="pick another with --port N (or leave it out: any free port)",
        code="dashboard-port-taken",
    )
