"""The dashboard's web application (aiohttp): the page and its files, the JSON API over
`Views`, a run's log as server-sent events, and the access checks in front of all of it
(vmrun.dashboard.access). Blocking work (SSH) runs in threads, never on the loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import resources
from typing import Any

from aiohttp import web

from vmrun.dashboard.access import COOKIE, HEADER, Access, same_origin
from vmrun.dashboard.follow import Followers, Line
from vmrun.dashboard.views import Views
from vmrun.errors import VmrunError

KEEPALIVE_S = 15.0  # a comment line on a quiet log stream, so proxies keep it open
STATIC = {  # the page's files, all in the wheel (no CDN: it works offline)
    "app.js": "text/javascript",
    "style.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:;"
    " style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",  # uPlot sizes by style
    "X-Frame-Options": "DENY",  # the stop button in someone else's frame: never
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
ERROR_STATUS = {"run-not-found": 404, "usage": 400}
VIEWS: web.AppKey[Views] = web.AppKey("views", Views)
FOLLOWERS: web.AppKey[Followers] = web.AppKey("followers", Followers)
ACCESS: web.AppKey[Access] = web.AppKey("access", Access)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(views: Views, access: Access) -> web.Application:
    app = web.Application(middlewares=[_guard])
    app[ACCESS] = access
    app[VIEWS] = views
    app[FOLLOWERS] = Followers(views.follow)
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/api/runs", partial(_call, "runs"))
    app.router.add_get("/api/gpus", partial(_call, "gpus"))
    app.router.add_get("/api/runs/{run}", partial(_call, "run"))
    app.router.add_get("/api/runs/{run}/metrics", partial(_call, "metrics"))
    app.router.add_get("/api/runs/{run}/events", partial(_call, "events"))
    app.router.add_get("/api/runs/{run}/files", partial(_call, "files"))
    app.router.add_get("/api/runs/{run}/log", _log)
    app.router.add_post("/api/runs/{run}/stacks", partial(_call, "stacks"))
    app.router.add_post("/api/runs/{run}/stop", partial(_call, "stop"))
    app.router.add_get("/api/sweeps", partial(_call, "sweeps"))
    app.router.add_get("/api/sweeps/{sweep}", _sweep)
    app.router.add_get("/api/gpus/clusters", partial(_call, "cluster_gpus"))
    app.on_response_prepare.append(_headers)
    return app


def allowed(access: Access, request: web.Request) -> str | None:
    """Why the request is refused, or None: the token (URL, cookie or header) for every
    request; for an action, also this page's own origin (or the token in the header, which
    no other site's page can set without asking, and is never asked)."""
    offered = request.query.get("token"), request.cookies.get(COOKIE), request.headers.get(HEADER)
    if not access.holds(*offered):
        return "no token: open the address `vmrun dashboard` printed"
    if request.method in ("GET", "HEAD"):
        return None
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site not in (None, "same-origin", "none"):
        return f"a {fetch_site} request may not act here"
    own = same_origin(request.headers.get("Origin"), request.headers.get("Referer"), request.host)
    if not own and not access.holds(request.headers.get(HEADER)):
        return "an action must come from the dashboard's own page"
    return None


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    access = request.app[ACCESS]
    why = allowed(access, request)
    if why is not None:
        return web.json_response({"error": {"code": "forbidden", "message": why}}, status=403)
    if "token" in request.query and request.method == "GET":
        # the token leaves the address bar (and history) for a cookie only this site sends
        kept = [(k, v) for k, v in request.query.items() if k != "token"]
        target = request.rel_url.with_query(kept)
        found = web.HTTPFound(str(target))
        found.set_cookie(COOKIE, access.cookie_value(), httponly=True, samesite="Strict", path="/")
        raise found
    return await handler(request)


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


def _file(name: str) -> bytes:
    return resources.files("vmrun.dashboard").joinpath("static").joinpath(name).read_bytes()


async def _page(request: web.Request) -> web.Response:
    return web.Response(body=_file("index.html"), content_type="text/html")


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    return web.Response(body=_file(name), content_type=STATIC[name])


async def _call(verb: str, request: web.Request) -> web.Response:
    """A view's value as JSON; a VmrunError as `{"error": ...}` with its code."""
    views = request.app[VIEWS]
    args = [request.match_info["run"]] if "run" in request.match_info else []
    try:
        value = await asyncio.to_thread(getattr(views, verb), *args)
    except VmrunError as exc:
        status = ERROR_STATUS.get(exc.code, 502)
        error = {"code": exc.code, "message": exc.one_line()}
        return web.json_response({"error": error}, status=status)
    return web.json_response(value, dumps=partial(json.dumps, default=str))


async def _sweep(request: web.Request) -> web.Response:
    """One sweep's page (`Views.sweep`), by its id; errors as `_call`'s."""
    try:
        value = await asyncio.to_thread(request.app[VIEWS].sweep, request.match_info["sweep"])
    except VmrunError as exc:
        error = {"code": exc.code, "message": exc.one_line()}
        return web.json_response({"error": error}, status=ERROR_STATUS.get(exc.code, 502))
    return web.json_response(value, dumps=partial(json.dumps, default=str))


async def _log(request: web.Request) -> web.StreamResponse:
    """The run's log as server-sent events: every line kept so far, then each new one as it
    comes, until the run ends (an `end` event) or the page goes."""
    follower = request.app[FOLLOWERS].of(request.match_info["run"])
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[Line] = asyncio.Queue()

    def listener(line: Line) -> None:
        loop.call_soon_threadsafe(lines.put_nowait, line)

    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    backlog = follower.listen(listener)
    try:
        await response.write(b"".join(_event(line) for line in backlog))
        last = backlog[-1].seq if backlog else 0
        ended = any(line.kind == "end" for line in backlog)
        while not ended:
            try:
                line = await asyncio.wait_for(lines.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if line.seq <= last:
                continue  # in the backlog already
            await response.write(_event(line))
            ended = line.kind == "end"
    except ConnectionResetError:
        pass  # the page went; the follower goes on for the others
    finally:
        follower.leave(listener)
    return response


def _event(line: Line) -> bytes:
    data: dict[str, Any] = {"kind": line.kind, "text": line.text, "at": line.at}
    return f"id: {line.seq}\ndata: {json.dumps(data)}\n\n".encode()
