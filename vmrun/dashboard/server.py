"""Serving the dashboard: the `dashboard` extra checked, one connection pool for the whole
server (one SSH connection per host), the address printed with its token, and the server
until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.dashboard.access import Access
    from vmrun.dashboard.views import Views

DEFAULT_PORT = 8777  # taken already: any free port (a port the user named: an error)


def check_extra(*, imported: bool = True) -> None:
    """aiohttp is there, else one line naming the extra (`imported`: as a module that
    imports, else only found: no import yet)."""
    from importlib.util import find_spec

    try:
        if imported:
            import aiohttp  # noqa: F401
        elif find_spec("aiohttp") is None:
            raise ImportError("aiohttp")
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
    token included, once it listens: before aiohttp is imported (a third of the start), so
    that a browser opens meanwhile; its first connection waits in the socket's backlog.
    `store`: a bucket place whose runs are listed too (None: vmrun.toml's `store`, where it
    has one)."""
    check_extra(imported=False)
    from vmrun.dashboard.access import Access
    from vmrun.dashboard.views import Views
    from vmrun.ssh import pool

    access = Access()
    sockets = _listen(bind, port)
    try:
        bound = sockets[0].getsockname()[1]
        host = f"[{bind}]" if ":" in bind else bind
        opened(f"http://{host}:{bound}/?token={access.token}")
        with pool.holding(), contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the end
            check_extra()
            views = Views(settings, hosts=hosts, cluster=cluster, store=store)
            asyncio.run(_serve(views, access, sockets))
    finally:
        for sock in sockets:
            sock.close()


async def _serve(views: Views, access: Access, sockets: list[socket.socket]) -> None:
    from aiohttp import web

    from vmrun.dashboard.app import make_app

    runner = web.AppRunner(make_app(views, access), access_log=None)
    await runner.setup()
    warming = None
    try:
        for sock in sockets:
            await web.SockSite(runner, sock).start()
        warming = asyncio.get_running_loop().run_in_executor(None, views.warm)
        await asyncio.Event().wait()  # until Ctrl-C
    finally:
        if warming is not None:
            warming.cancel()
        await runner.cleanup()


def _listen(bind: str, port: int | None) -> list[socket.socket]:
    """Listening sockets on `port`, one per address `bind` names (as asyncio's server opens
    them); with no port, on DEFAULT_PORT where it is free, else on any free port."""
    for tried in [DEFAULT_PORT, 0] if port is None else [port]:
        try:
            return _sockets(bind, tried)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise UsageError(
        f"port {port} is in use here",
        hint="pick another with --port N (or leave it out: any free port)",
        code="dashboard-port-taken",
    )


def _sockets(bind: str, port: int) -> list[socket.socket]:
    """Opened here, not by aiohttp, so that they listen (and the address can be printed)
    before aiohttp is imported."""
    made: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(128)
    except BaseException:
        for sock in made:
            sock.close()
        raise
    return made
