"""Crackseg as a Label Studio ML backend: the routes Label Studio calls, served by Starlette under uvicorn.

    crackseg serve label-studio --checkpoint best.pt        then, in Label Studio: Project > Settings > Model >
                                                            Connect Model, Backend URL http://127.0.0.1:9090

Routes (label-studio-ml-backend's api.py): ``GET /`` and ``/health``, ``POST /setup`` (the project's labelling config,
checked), ``POST /predict`` (a result per task, in order), ``POST /webhook`` (acknowledged; crackseg does not train
from it), ``GET /metrics``. With basic auth set every route needs it. Every error the routes answer is
``{"error": "<one line>"}`` with its status (uvicorn answers what is not HTTP); the server keeps serving after it.

A task's image is fetched as Label Studio serves it: its own URLs (``/data/upload/...``, ``/data/local-files/?d=...``,
or any URL on ``LABEL_STUDIO_URL``'s origin) with ``LABEL_STUDIO_API_KEY`` (a legacy token as ``Token KEY``; a
personal access token, a JWT, exchanged at ``/api/token/refresh/`` for an access token sent as ``Bearer``), others
without it, and from nowhere a task should not reach (:mod:`crackseg.integrations.fetching`). A client must send a
request's headers within ``header_timeout_s`` and its body within ``body_timeout_s``, so clients that never finish
cannot hold the connections others need; a JSON body nested deeper than :data:`MAX_JSON_DEPTH` is refused. Tasks of one request run one after another, until its client has gone; up to ``concurrency`` tasks (fetch, decoding, model) run at
once across requests. When some tasks of a request fail, those get an ``error`` and no ``result``, which Label Studio
passes over (an empty result would be stored as "no cracks" and never asked for again); when all fail, the request
fails with the first task's error.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import io
import json
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import anyio
import numpy as np
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from PIL import Image
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from crackseg.core.errors import InputError
from crackseg.core.urls import url_problem
from crackseg.core.version import __version__
from crackseg.data.images import DECODE_ERRORS, describe_error, picture_pixels
from crackseg.integrations.fetching import HttpError, ImageFetcher
from crackseg.integrations.label_studio import ProtocolError, Target, image_url, read_config
from crackseg.core.digest import model_file_digest
from crackseg.prediction.uncertainty import uncertainty

if TYPE_CHECKING:
    from crackseg.prediction.session import PredictionSession  # torch: the caller loads it

MIB = 2**20
MAX_CONNECTIONS = 256  # open connections uvicorn takes before answering 503: bounds the requests waiting for a slot
MAX_JSON_DEPTH = 64  # nesting of a request's JSON; Label Studio's tasks need a handful
_SHOWN_URL = 200  # characters of a URL quoted in an error


@dataclass(frozen=True)
class ServerSettings:
    """How the backend reaches Label Studio and what it accepts; secrets stay out of its repr."""

    label_studio_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)  # (user, password) every request must give
    max_request_bytes: int = 16 * MIB
    max_image_bytes: int = 64 * MIB
    concurrency: int = 2  # tasks fetched, decoded and predicted at once
    fetch_timeout_s: float = 30.0
    allowed_hosts: tuple[str, ...] = ()  # hosts (or host:port) fetched from at any address, besides LABEL_STUDIO_URL's
    header_timeout_s: float = 10.0  # a client must send a request's headers within this, and its body within body_timeout_s
    body_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        given = self.label_studio_url or "http://host"
        url = urlparse(given) if url_problem(given) is None else None
        if url is None or url.scheme not in ("http", "https") or not url.hostname:
            raise InputError(f"LABEL_STUDIO_URL must be Label Studio's http(s) address, e.g. http://localhost:8080, "
                             f"got {self.label_studio_url!r}")


def model_version(checkpoint: Path, settings: str = "") -> str:
    """``crackseg VERSION NAME@DIGEST SETTINGS``: the first 8 hex digits of the model file's SHA-256
    (:func:`~crackseg.core.digest.model_file_digest`), so Label Studio tells two models apart even when both are called best.pt, and the settings that
    change its masks (threshold, ...), so that it asks again for predictions made with others."""
    path = Path(checkpoint)
    return f"crackseg {__version__} {path.name}@{model_file_digest(path)[:8]}" + (f" {settings}" if settings else "")


def build_app(session: PredictionSession, settings: ServerSettings, version: str) -> Starlette:
    """The backend's app around a loaded model; ``version`` is the model_version Label Studio records."""
    backend = _Backend(session, settings, version)
    routes = [Route("/", backend.health), Route("/health", backend.health), Route("/metrics", backend.metrics),
              Route("/setup", backend.setup, methods=["POST"]), Route("/predict", backend.predict, methods=["POST"]),
              Route("/webhook", backend.webhook, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _error_response, Exception: _bug_response},
                    lifespan=backend.lifespan)
    if settings.basic_auth is not None:
        app.add_middleware(_BasicAuth, credentials=settings.basic_auth)
    return app


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: any free port), so the URL to give Label Studio is known before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.getaddrinfo(host or None, port, family, socket.SOCK_STREAM)  # "" is every interface, as for bind
    except socket.gaierror as error:
        raise InputError(f"--host {host}: not an address of this machine or a name that resolves ({error.strerror})") from None
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:  # in use, not this machine's address, a privileged port
        raise InputError(f"--host {host} --port {port}: cannot listen there ({error.strerror or error})") from None


def serve(app: Starlette, listener: socket.socket, header_timeout_s: float = 10.0) -> None:
    """Serve ``app`` on ``listener`` until Ctrl-C or SIGTERM; a connection that has not sent a request's headers within
    ``header_timeout_s`` is closed."""
    protocol = type("_Protocol", (_HeaderDeadline,), {"header_timeout_s": header_timeout_s})
    config = uvicorn.Config(app, http=protocol, limit_concurrency=MAX_CONNECTIONS, server_header=False, log_level="info")
    uvicorn.Server(config).run(sockets=[listener])


class _HeaderDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers, from the connection (or the end of the
    previous response, where the keep-alive timeout takes over) until they are complete: a client that opens
    connections and never finishes a request cannot keep them, nor the connection slots, for ever."""

    header_timeout_s = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):  # the next request begins
            self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)
        super().data_received(data)
        if self._deadline is not None and self.cycle is not None and not self.cycle.response_complete:  # headers complete
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


async def _error_response(request: Request, error: HTTPException) -> JSONResponse:
    return JSONResponse({"error": error.detail}, error.status_code, headers=error.headers)


async def _bug_response(request: Request, error: Exception) -> JSONResponse:
    """A bug's one line for Label Studio; uvicorn logs its traceback."""
    return JSONResponse({"error": f"crackseg failed: {type(error).__name__}: {error}".splitlines()[0]}, 500)


class _Backend:
    """The route handlers; the model runs in worker threads, at most ``concurrency`` tasks at once."""

    def __init__(self, session: PredictionSession, settings: ServerSettings, version: str):
        self._session, self._settings, self._version = session, settings, version
        self._limiter = anyio.CapacityLimiter(settings.concurrency)
        self._parsing = anyio.CapacityLimiter(settings.concurrency)  # a body's parse takes many times its bytes
        self._fetcher = ImageFetcher(settings.label_studio_url, settings.api_key, settings.allowed_hosts,
                                     settings.max_image_bytes, settings.fetch_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        yield
        self._fetcher.close()

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "UP", "model_class": "crackseg", "model_version": self._version})

    async def metrics(self, request: Request) -> JSONResponse:
        return JSONResponse({})

    async def setup(self, request: Request) -> JSONResponse:
        """Label Studio connecting a project: its labelling config must have a brush or polygon crack label."""
        body = await _json_body(request, self._settings, self._parsing)
        _target(body.get("schema"))
        return JSONResponse({"model_version": self._version})

    async def webhook(self, request: Request) -> JSONResponse:
        body = await _json_body(request, self._settings, self._parsing)
        return JSONResponse({"status": "ignored", "action": body.get("action"),
                             "detail": "crackseg does not train from Label Studio: export the annotations, then "
                                       "crackseg labels import and crackseg train"})

    async def predict(self, request: Request) -> JSONResponse:
        body = await _json_body(request, self._settings, self._parsing)
        tasks = body.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise HttpError(400, "no tasks: /predict takes {\"tasks\": [{\"id\": ..., \"data\": {...}}, ...], \"label_config\": ...}")
        target = _target(body.get("label_config"))
        entries, failures = [], []
        for task in tasks:
            if await request.is_disconnected():  # gone (Label Studio timed out): its other tasks would hold the slots
                return Response(status_code=499)
            try:
                entries.append(await anyio.to_thread.run_sync(self._task_result, task, target, limiter=self._limiter))
            except HttpError as error:
                failures.append(error)
                entries.append({"model_version": self._version, "error": error.detail})  # no result: stored as no prediction
        if len(failures) == len(tasks):
            raise failures[0]
        return JSONResponse({"results": entries})

    def _task_result(self, task, target: Target) -> dict:
        """One task's prediction: its image fetched and decoded, predict's mask as ``target``'s results, and as score
        the share of pixels the model is sure of (Label Studio sorts tasks by it: least sure first to label)."""
        try:
            url = image_url(task, target, self._settings.label_studio_url)
        except ProtocolError as error:
            raise HttpError(422, str(error)) from None
        where = f"task {task.get('id')}: {_shown(url)}"
        pixels = _decoded(self._fetcher.fetch(url, where), where)
        probabilities = self._session.probabilities(pixels)
        score = 1.0 - uncertainty(probabilities, self._session.threshold)["uncertainty"]
        return {"result": target.results(probabilities >= self._session.threshold), "score": score,
                "model_version": self._version}


def _target(config) -> Target:
    try:
        return read_config(config)
    except ProtocolError as error:
        raise HttpError(422, str(error)) from None


async def _json_body(request: Request, settings: ServerSettings, parsing: anyio.CapacityLimiter) -> dict:
    """The request's JSON object, read no further than the size limit whatever Content-Length says, within the body
    timeout, and nested no deeper than MAX_JSON_DEPTH; ``parsing`` bounds the bodies parsed at once."""
    limit = settings.max_request_bytes
    too_large = HttpError(413, f"request body over {limit} bytes (crackseg serve label-studio --max-request-mb)")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    with anyio.move_on_after(settings.body_timeout_s) as timer:
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
        except ClientDisconnect:  # nobody to answer
            raise HttpError(400, "the client closed the connection before its request body arrived") from None
    if timer.cancelled_caught:
        raise HttpError(408, f"the request body did not arrive within {settings.body_timeout_s:g} s")
    return await anyio.to_thread.run_sync(_document, bytes(body), limiter=parsing)  # beside the event loop, not in it


def _document(body: bytes) -> dict:
    """JSON in UTF-8, as RFC 8259 has systems exchange it: where json.loads would guess UTF-16 or UTF-32, the bytes that
    :func:`_nesting` counts would not be the text's quotes and brackets."""
    try:
        text = body.decode("utf-8-sig")  # a byte order mark, as json.loads of bytes takes it
    except UnicodeDecodeError as error:
        raise HttpError(400, f"the request body is not UTF-8 JSON ({error.reason} at byte {error.start})") from None
    depth = _nesting(body)
    if depth > MAX_JSON_DEPTH:
        raise HttpError(400, f"the request body nests {depth} levels deep, more than the {MAX_JSON_DEPTH} crackseg reads")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise HttpError(400, f"the request body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise HttpError(400, f"the request body must be a JSON object, got {type(document).__name__}")
    if _SURROGATE_ESCAPE.search(body):  # a pair is one character; only then is the whole document checked for a lone one
        try:
            json.dumps(document, ensure_ascii=False).encode()
        except UnicodeEncodeError as error:
            raise HttpError(400, f"the request body escapes a lone UTF-16 surrogate ({error.object[error.start]!r}), "
                                 "which is no character") from None
    return document


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _nesting(body: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, strings left out; counted without parsing, so a
    document nested thousands deep costs no recursion, and over the quotes, backslashes and brackets alone, so no body
    costs more than a few passes over its bytes.

    A quote opens or closes a string unless an odd run of backslashes comes just before it."""
    text = np.frombuffer(body, np.uint8)
    runs = np.flatnonzero(np.diff(np.concatenate(([0], (text == ord("\\")).view(np.int8), [0]))))
    run_starts, run_ends = runs[::2], runs[1::2]  # backslash runs, [start, end)
    quotes = np.flatnonzero(text == ord('"'))
    if run_ends.size:
        ending = np.minimum(np.searchsorted(run_ends, quotes), run_ends.size - 1)  # the run that may end at each quote
        quotes = quotes[~((run_ends[ending] == quotes) & ((run_ends - run_starts)[ending] % 2 == 1))]
    opens, closes = np.flatnonzero(np.isin(text, (ord("["), ord("{")))), np.flatnonzero(np.isin(text, (ord("]"), ord("}"))))
    brackets = np.concatenate((opens, closes))
    steps = np.concatenate((np.ones(opens.size, np.int64), -np.ones(closes.size, np.int64)))[np.argsort(brackets, kind="stable")]
    outside = np.searchsorted(quotes, np.sort(brackets)) % 2 == 0  # an even number of string quotes before it
    return int(np.cumsum(steps[outside]).max(initial=0))


def _decoded(content: bytes, where: str):
    """(H, W, 3) uint8 pixels of an image file's bytes, refused past Pillow's pixel limit before decoding."""
    try:
        with Image.open(io.BytesIO(content)) as image:
            if image.width * image.height > 2 * (Image.MAX_IMAGE_PIXELS or float("inf")):  # where predict refuses too
                raise Image.DecompressionBombError("too many pixels")
            return picture_pixels(image)
    except DECODE_ERRORS as error:
        raise HttpError(422, f"{where}: {describe_error(error)}") from None


def _shown(url: str) -> str:
    return url if len(url) <= _SHOWN_URL else url[:_SHOWN_URL] + "..."


class _BasicAuth:
    """ASGI middleware: every HTTP request must carry the basic-auth user and password Label Studio was given."""

    def __init__(self, app, credentials: tuple[str, str]):
        self._app = app
        self._expected = [part.encode() for part in credentials]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not self._allowed(Headers(scope=scope).get("authorization", "")):
            response = JSONResponse({"error": "unauthorized: give the basic auth user and password crackseg serve was started with"},
                                    401, headers={"WWW-Authenticate": 'Basic realm="crackseg"'})
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _allowed(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (ValueError, binascii.Error):
            return False
        user_ok = hmac.compare_digest(user, self._expected[0])
        return hmac.compare_digest(password, self._expected[1]) & user_ok  # both compared, whichever is wrong
