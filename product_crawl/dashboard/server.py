"""The dashboard's HTTP server: twisted.web in the reactor Scrapy installs, static assets and a JSON API.

Endpoints (docs/dashboard.md):

``GET /``, ``GET /static/...``
    the page (plain JavaScript and CSS from ``static/``, nothing loaded from elsewhere).
``GET /api/status``
    the ``scrapy status --json`` snapshot (schema ``v: 1``).
``GET /api/history?since=T&limit=N``
    history samples after Redis time ``T`` (:mod:`scheduler_ext.history`).
``GET /api/session``
    ``{actions, operator, methods, csrf, refresh}``: what this visitor may do; 401 for credentials that do not match.
``GET /api/products[?product=P]``, ``GET /api/deadletter``, ``GET /api/items?product=&site=&q=&limit=``
    the other views' data.
``GET /api/export?product=P&format=jsonl|csv``
    one product's items, streamed.
``POST /api/deadletter/requeue``, ``POST /api/deadletter/drop`` (JSON body ``{"id": ...}``)
    the two actions: credentials and the ``X-CSRF-Token`` header required; audited.
``GET /login``
    asks the browser for basic-auth credentials, then goes back to the page.

Every Redis and MongoDB call runs in the reactor's thread pool. The sampling of the history runs here too, every
``SCHEDEXT_HISTORY_INTERVAL``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from twisted.internet import task, threads
from twisted.internet.interfaces import IListeningPort, IPushProducer
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from twisted.web.static import File
from zope.interface import implementer

from product_crawl.dashboard.auth import Auth, Refused
from product_crawl.dashboard.data import EXPORT_FORMATS, DashboardData, DataUnavailable
from product_crawl.services import stop_pid, tied_to_parent
from scheduler_ext.deadletter import UnknownEntry
from scheduler_ext.exceptions import InvalidInput
from scheduler_ext.status import finite

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
LISTENING_PREFIX = "dashboard listening on "
LOOPBACK_NAMES = {"localhost"}
SECURITY_HEADERS = {
    b"Content-Security-Policy": b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                                b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    b"X-Content-Type-Options": b"nosniff", b"X-Frame-Options": b"DENY", b"Referrer-Policy": b"no-referrer",
    b"Cache-Control": b"no-store",
}


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpError(Exception):
    """Raised by a handler to answer with ``status`` and a JSON ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _arg(request: Request, name: str, default: str | None = None) -> str | None:
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") if values else default


def _int_arg(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = _arg(request, name)
    if raw is None:
        return default
    try:
        return max(lo, min(hi, int(raw)))
    except ValueError:
        raise HttpError(400, f"{name}: expected an integer, got {raw!r}") from None


def _float_arg(request: Request, name: str) -> float | None:
    raw = _arg(request, name)
    try:
        return None if raw in (None, "") else float(raw)  # type: ignore[arg-type]
    except ValueError:
        raise HttpError(400, f"{name}: expected a number (Unix seconds), got {raw!r}") from None


def _secure(request: Request) -> None:
    for name, value in SECURITY_HEADERS.items():
        request.setHeader(name, value)


def _json(request: Request, status: int, body: Any) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
    # Text read from Redis that was not UTF-8 holds lone surrogates (surrogateescape): backslashreplace writes them
    # as \udcXX, a valid escape inside a JSON string, rather than failing the response (and the page with it).
    return json.dumps(finite(body), ensure_ascii=False, sort_keys=True).encode("utf-8", "backslashreplace")


@implementer(IPushProducer)
class _Streamer:
    """Writes the chunks of a blocking iterator (read in the thread pool) to a response, pausing when the client
    reads slower than the cursor delivers: memory stays one chunk whatever the export's size."""

    def __init__(self, request: Request, chunks: Iterator[bytes]) -> None:
        self.request, self.chunks = request, chunks
        self.paused = self.stopped = self.waiting = self.fetching = False
        request.notifyFinish().addErrback(lambda _: self.stopProducing())

    def start(self) -> None:
        self.request.registerProducer(self, True)
        self._next()

    def _next(self) -> None:
        self.waiting, self.fetching = False, True
        d = threads.deferToThread(next, self.chunks, None)
        d.addBoth(self._fetched)
        d.addCallbacks(self._write, self._failed)

    def _fetched(self, result: Any) -> Any:
        self.fetching = False
        if self.stopped:  # the client went away while the chunk was read: now the cursor may be closed
            self._close()
        return result

    def _close(self) -> None:
        # Closing the generator runs its `finally` (the cursor's close), never while a thread is inside it.
        threads.deferToThread(self.chunks.close)  # type: ignore[attr-defined]

    def _write(self, chunk: bytes | None) -> None:
        if self.stopped:
            return
        if chunk is None:
            self.request.unregisterProducer()
            self.request.finish()
            return
        self.request.write(chunk)
        if self.paused:
            self.waiting = True
        else:
            self._next()

    def _failed(self, failure: Failure) -> None:
        if self.stopped:
            return
        logger.error("dashboard: export failed: %s", failure.getErrorMessage())
        self.stopped = True
        self.request.unregisterProducer()
        if self.request.startedWriting:
            self.request.loseConnection()  # a truncated download, never one that looks complete
        else:
            self.request.setHeader(b"Content-Disposition", b"inline")
            self.request.write(_json(self.request, 503, {"error": "MongoDB did not answer; export not started"}))
            self.request.finish()

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        if self.waiting and not self.stopped:
            self._next()

    def stopProducing(self) -> None:
        if not self.stopped:
            self.stopped = True
            if not self.fetching:
                self._close()


class Api(Resource):
    """``/api/*``: each handler runs in the thread pool and returns ``(status, body)``."""

    isLeaf = True

    def __init__(self, data: DashboardData, auth: Auth, refresh: float, history_interval: float) -> None:
        super().__init__()
        self.data, self.auth, self.refresh, self.history_interval = data, auth, refresh, history_interval
        self.get_routes: dict[str, Callable[[Request], Any]] = {
            "status": lambda r: self.data.status(),
            "history": self._history,
            "products": lambda r: self.data.products(_arg(r, "product") or None),
            "deadletter": lambda r: self.data.deadletters(),
            "items": self._items,
        }

    # --- helpers --------------------------------------------------------------------------------------------
    def _respond(self, request: Request, work: Callable[[], Any]) -> Any:
        def done(body: Any) -> None:
            if not request._disconnected:
                request.write(_json(request, 200, body))
                request.finish()

        def failed(failure: Failure) -> None:
            if failure.check(HttpError):
                status, message = failure.value.status, str(failure.value)
            elif failure.check(DataUnavailable):
                status, message = 503, str(failure.value)
            else:
                # Anything else is a bug or Redis gone: logged here, answered without internals (no URLs).
                logger.error("dashboard: %s failed: %s", request.path.decode(), failure.getErrorMessage())
                status, message = 503, f"could not read the deployment's state ({failure.type.__name__})"
            if not request._disconnected:
                request.write(_json(request, status, {"error": message}))
                request.finish()

        threads.deferToThread(self.data.store.healed, work).addCallbacks(done, failed)
        return NOT_DONE_YET

    def _principal(self, request: Request) -> str | None:
        try:
            return self.auth.principal(request.getHeader(b"authorization"))
        except Refused as exc:
            raise HttpError(401, str(exc)) from None

    def _history(self, request: Request) -> dict[str, Any]:
        limit = _int_arg(request, "limit", self.data.history.maxlen, 1, self.data.history.maxlen)
        return {"v": 1, "interval": self.history_interval,
                "samples": self.data.history.read(_float_arg(request, "since"), limit)}

    def _items(self, request: Request) -> dict[str, Any]:
        items = self.data.items(_arg(request, "product"), _arg(request, "site"), _arg(request, "q", "") or "",
                                _int_arg(request, "limit", 50, 1, 500))
        return {"v": 1, "items": items}

    # --- GET ------------------------------------------------------------------------------------------------
    def render_GET(self, request: Request) -> Any:
        _secure(request)
        name = b"/".join(request.postpath).decode("utf-8", "replace")
        if name == "session":
            try:
                operator = self._principal(request)
            except HttpError as exc:
                return _json(request, exc.status, {"error": str(exc)})
            return _json(request, 200, {"v": 1, "actions": self.auth.actions_enabled, "methods": self.auth.methods,
                                        "operator": operator, "csrf": self.auth.csrf, "refresh": self.refresh})
        if name == "export":
            return self._export(request)
        route = self.get_routes.get(name)
        if route is None:
            return _json(request, 404, {"error": f"no such endpoint: /api/{name}"})
        return self._respond(request, lambda: route(request))

    def _export(self, request: Request) -> Any:
        product, fmt = _arg(request, "product"), _arg(request, "format", "jsonl")
        if not product or fmt not in EXPORT_FORMATS:
            return _json(request, 400, {"error": "expected ?product=NAME&format=jsonl|csv"})
        if self.data.collection is None:
            return _json(request, 503, {"error": "no items collection is configured"})
        mime = {"jsonl": b"application/x-ndjson", "csv": b"text/csv"}[fmt]
        request.setHeader(b"Content-Type", mime + b"; charset=utf-8")
        # The product's name as the file's (RFC 6266 filename*, UTF-8), "items.<format>" for older clients.
        request.setHeader(b"Content-Disposition", f"attachment; filename=\"items.{fmt}\"; filename*=UTF-8''"
                                                  f"{quote(product, safe='')}.{fmt}".encode("ascii"))
        _Streamer(request, self.data.export(product, fmt)).start()
        return NOT_DONE_YET

    # --- POST: the audited actions ------------------------------------------------------------------------------
    def render_POST(self, request: Request) -> Any:
        _secure(request)
        name = b"/".join(request.postpath).decode("utf-8", "replace")
        try:
            action = {"deadletter/requeue": "requeue", "deadletter/drop": "drop"}.get(name)
            if action is None:
                raise HttpError(404, f"no such action: /api/{name}")
            actor = self._authorize(request)
            entry_id = self._entry_id(request)
        except HttpError as exc:
            logger.warning("dashboard: refused POST /api/%s from %s: %s", name, request.getClientAddress().host,
                           exc)
            return _json(request, exc.status, {"error": str(exc)})

        def act() -> dict[str, Any]:
            try:
                if action == "requeue":
                    to = self.data.requeue(entry_id, actor)
                else:
                    self.data.drop(entry_id, actor)
                    to = None
            except UnknownEntry as exc:  # never there, or removed meanwhile (a second click)
                raise HttpError(404, str(exc)) from exc
            except InvalidInput as exc:  # nothing to requeue in it: drop only
                raise HttpError(409, str(exc)) from exc
            logger.info("dashboard: %s %s dead-letter entry %s", actor, action, entry_id)
            return {"ok": True, "action": action, "id": entry_id, "to": to}

        return self._respond(request, act)

    def _authorize(self, request: Request) -> str:
        if not self.auth.actions_enabled:
            raise HttpError(403, "read-only dashboard: set PC_DASHBOARD_TOKEN or PC_DASHBOARD_USER and "
                                 "PC_DASHBOARD_PASSWORD to allow actions")
        operator = self._principal(request)
        if operator is None:
            raise HttpError(401, "credentials required")
        origin = request.getHeader(b"origin")
        host = request.getHeader(b"host") or b""
        if origin is not None and urlsplit(origin.decode("latin-1")).netloc.encode() != host:
            raise HttpError(403, "cross-origin request refused")
        if not self.auth.csrf_ok(request.getHeader(b"x-csrf-token")):
            raise HttpError(403, "missing or wrong X-CSRF-Token (reload the page)")
        return f"dashboard:{operator}@{request.getClientAddress().host}"

    @staticmethod
    def _entry_id(request: Request) -> str:
        try:
            body = json.loads(request.content.read(4096) or b"{}")
        except (ValueError, RecursionError):
            raise HttpError(400, 'body: expected JSON {"id": "<dead-letter id>"}') from None
        entry_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(entry_id, str) or not entry_id:
            raise HttpError(400, 'body: expected JSON {"id": "<dead-letter id>"} with a non-empty string id')
        return entry_id


class Login(Resource):
    """``/login``: makes the browser ask for basic-auth credentials (the API never sends WWW-Authenticate, so a
    read-only visitor is never prompted)."""

    isLeaf = True

    def __init__(self, auth: Auth) -> None:
        super().__init__()
        self.auth = auth

    def render_GET(self, request: Request) -> bytes:
        _secure(request)
        try:
            if self.auth.principal(request.getHeader(b"authorization")) is not None:
                request.redirect(b"/")
                return b""
        except Refused:
            pass
        if not self.auth.user:
            return _json(request, 404, {"error": "basic authentication is not configured"})
        request.setResponseCode(401)
        request.setHeader(b"WWW-Authenticate", b'Basic realm="product_crawl dashboard", charset="UTF-8"')
        return b"credentials required"


class Root(Resource):
    def __init__(self, api: Api, auth: Auth, loopback_only: bool) -> None:
        super().__init__()
        self.loopback_only = loopback_only
        self.putChild(b"api", api)
        self.putChild(b"login", Login(auth))
        self.putChild(b"static", _Static(str(STATIC)))
        self.index = File(str(STATIC / "index.html"))

    def getChildWithDefault(self, path: bytes, request: Request) -> Resource:
        # DNS rebinding: a page on a foreign name must not reach a loopback-only dashboard through the browser.
        host = (request.getHeader(b"host") or b"").decode("latin-1")
        if self.loopback_only and not is_loopback(urlsplit("//" + host).hostname or ""):
            return _Forbidden("this dashboard answers only requests addressed to its loopback name")
        _secure(request)
        if path in (b"", b"index.html"):
            return self.index
        return super().getChildWithDefault(path, request)


class _Static(File):
    """The page's assets; no directory listing."""

    def directoryListing(self) -> Resource:
        return _Forbidden("no folder listing")


class _Forbidden(Resource):
    isLeaf = True

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def render(self, request: Request) -> bytes:
        return _json(request, 403, {"error": self.message})


class Dashboard:
    """The server and its history sampler; ``listen`` needs a running (or soon running) reactor."""

    def __init__(self, data: DashboardData, auth: Auth, *, refresh: float = 2.0, history_interval: float = 5.0
                 ) -> None:
        self.data, self.auth, self.refresh, self.history_interval = data, auth, refresh, history_interval
        self.port: IListeningPort | None = None
        self._sampler: task.LoopingCall | None = None
        self._sample_failing = False

    def listen(self, host: str, port: int) -> str:
        from twisted.internet import reactor  # the one the caller installed

        root = Root(Api(self.data, self.auth, self.refresh, self.history_interval), self.auth, is_loopback(host))
        site = Site(root)
        site.displayTracebacks = False
        self.port = reactor.listenTCP(port, site, interface=host)
        self._sampler = task.LoopingCall(self._sample)
        self._sampler.start(self.history_interval, now=True)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port.getHost().port}/"

    def _sample(self) -> Any:
        def ok(_: Any) -> None:
            if self._sample_failing:
                logger.info("dashboard: history sampling works again")
            self._sample_failing = False

        def failed(failure: Failure) -> None:
            if not self._sample_failing:  # log once per failing streak, not every interval
                logger.warning("dashboard: history sample failed: %s", failure.getErrorMessage())
            self._sample_failing = True

        return threads.deferToThread(self.data.sample).addCallbacks(ok, failed)

    def stop(self) -> None:
        if self._sampler is not None and self._sampler.running:
            self._sampler.stop()
        if self.port is not None:
            self.port.stopListening()


class DashboardProcess:
    """``scrapy dashboard`` as a subprocess (the demo and the tests): ``start`` returns its URL, read from the one
    line it prints once listening."""

    def __init__(self, args: list[str], *, cwd: Path, env: dict[str, str], log: Path | None = None,
                 timeout: float = 30.0) -> None:
        self.args, self.cwd, self.env, self.log, self.timeout = args, cwd, env, log, timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start(self) -> str:
        stderr: Any = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 (owned by Popen)
        self.proc = subprocess.Popen([sys.executable, "-m", "scrapy", "dashboard", *self.args], cwd=self.cwd,
                                     env=self.env, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                     preexec_fn=tied_to_parent())
        if self.log:
            stderr.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline().decode("utf-8", "replace").strip()
                if line.startswith(LISTENING_PREFIX):
                    self.url = line[len(LISTENING_PREFIX):]
                    return self.url
                if not line and self.proc.poll() is not None:
                    break
            elif self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"scrapy dashboard did not start (exit code {self.proc.returncode}); "
                           f"see {self.log or 'its stderr'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_pid(self.proc.pid)
            self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
