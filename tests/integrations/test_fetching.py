"""The Label Studio backend under hostile input: task URLs aimed inside the network (SSRF), the API token's origin,
clients that never finish a request, JSON nested thousands deep. Real HTTP servers on loopback throughout."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import RedirectResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from crackseg.integrations.fetching import MAX_REDIRECTS, HttpError, ImageFetcher  # noqa: E402
from crackseg.integrations.server import ServerSettings, build_app, serve  # noqa: E402

KEY = "legacy-token-0123456789"


class Site:
    """An HTTP server on 127.0.0.1 that records every request's path and Authorization header; ``/image`` answers bytes,
    ``/to?url=U`` redirects to U, ``/loop`` redirects to itself."""

    def __init__(self):
        self.seen: list[tuple[str, str | None]] = []
        app = Starlette(routes=[Route("/image", self.image), Route("/to", self.to), Route("/loop", self.loop)])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        threading.Thread(target=self.server.run, kwargs={"sockets": [self.listener]}, daemon=True).start()
        while not self.server.started:
            time.sleep(0.02)

    def _record(self, request) -> None:
        self.seen.append((request.url.path, request.headers.get("authorization")))

    async def image(self, request):
        self._record(request)
        return Response(b"image bytes", media_type="image/png")

    async def to(self, request):
        self._record(request)
        return RedirectResponse(request.query_params["url"], 302)

    async def loop(self, request):
        self._record(request)
        return RedirectResponse("/loop", 302)


@pytest.fixture(scope="module")
def sites():
    started = [Site() for _ in range(3)]  # Label Studio, an internal service, a file server the operator allows
    yield started
    for site in started:
        site.server.should_exit = True


def _fetcher(studio: Site, *allowed: str, studio_url: str | None = None) -> ImageFetcher:
    return ImageFetcher(studio_url or studio.url, KEY, allowed, 2**20, 10.0)


@pytest.mark.parametrize("target", [
    "http://127.0.0.1:{port}/image",
    "http://localhost:{port}/image",
    "http://[::ffff:127.0.0.1]:{port}/image",
    "http://2130706433:{port}/image",  # 127.0.0.1 as one number
    "http://0.0.0.0:{port}/image",
])
def test_a_task_cannot_reach_an_internal_address_directly(sites, target):
    studio, internal, _ = sites
    internal.seen.clear()
    with pytest.raises(HttpError) as refused:
        _fetcher(studio).fetch(target.format(port=internal.port), "task 1")
    assert refused.value.status_code == 403 and "non-public address" in refused.value.detail
    assert internal.seen == []


@pytest.mark.parametrize("address", ["169.254.169.254", "10.0.0.7", "192.168.1.1", "100.64.0.1", "[fd00::1]", "[fe80::1]"])
def test_private_link_local_and_shared_addresses_are_refused_before_connecting(sites, address):
    with pytest.raises(HttpError) as refused:
        _fetcher(sites[0]).fetch(f"http://{address}/latest/meta-data/", "task 2")
    assert refused.value.status_code == 403


def test_every_redirect_hop_is_checked_and_loops_end(sites):
    studio, internal, files = sites
    internal.seen.clear()
    fetcher = _fetcher(studio, f"127.0.0.1:{files.port}")
    for start in (f"{studio.url}/to?url={internal.url}/image", f"{files.url}/to?url={internal.url}/image"):
        with pytest.raises(HttpError, match="non-public address"):
            fetcher.fetch(start, "task 3")
    assert internal.seen == []
    assert fetcher.fetch(f"{studio.url}/to?url={files.url}/image", "task 3") == b"image bytes"  # an allowed hop is fetched
    with pytest.raises(HttpError, match=f"more than {MAX_REDIRECTS} redirects"):
        fetcher.fetch(f"{studio.url}/loop", "task 4")


def test_allowed_hosts_are_fetched_by_host_or_by_host_and_port(sites):
    studio, internal, _ = sites
    assert _fetcher(studio, f"127.0.0.1:{internal.port}").fetch(f"{internal.url}/image", "t") == b"image bytes"
    assert _fetcher(studio, "127.0.0.1").fetch(f"{internal.url}/image", "t") == b"image bytes"
    with pytest.raises(HttpError, match="non-public"):
        _fetcher(studio, f"127.0.0.1:{internal.port + 1 if internal.port < 65535 else 1}").fetch(f"{internal.url}/image", "t")


def test_images_are_fetched_straight_from_their_host_whatever_proxy_the_environment_names(sites, monkeypatch):
    studio, internal, _ = sites
    with socket.create_server(("127.0.0.1", 0)) as closed:
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    internal.seen.clear()
    assert _fetcher(studio, "127.0.0.1").fetch(f"{internal.url}/image", "t") == b"image bytes"
    assert internal.seen == [("/image", None)]


def test_the_token_goes_to_label_studios_exact_origin_only(sites):
    studio, internal, files = sites
    fetcher = _fetcher(studio, "127.0.0.1")
    studio.seen.clear()
    internal.seen.clear()
    fetcher.fetch(f"{studio.url}/image", "t")
    fetcher.fetch(f"{internal.url}/image", "t")  # the same host, another port
    fetcher.fetch(f"{studio.url}/to?url={internal.url}/image", "t")  # across a redirect
    assert [header for _, header in studio.seen] == [f"Token {KEY}", f"Token {KEY}"]
    assert [header for _, header in internal.seen] == [None, None]
    tls = _fetcher(studio, "127.0.0.1", studio_url=f"https://127.0.0.1:{studio.port}")  # Label Studio on https
    studio.seen.clear()
    tls.fetch(f"{studio.url}/image", "t")  # the same host and port over plain http
    assert studio.seen == [("/image", None)]


def _backend(**settings) -> str:
    """crackseg's server (its real uvicorn protocol) with a stand-in model, in a thread; its URL."""

    class Model:
        threshold = 0.5

        def probabilities(self, pixels):
            raise AssertionError("no task should reach the model")

    listener = socket.create_server(("127.0.0.1", 0))
    chosen = ServerSettings(**settings)
    threading.Thread(target=serve, args=(build_app(Model(), chosen, "crackseg test"), listener, chosen.header_timeout_s),
                     daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    for _ in range(200):
        try:
            httpx.get(f"{url}/health", timeout=1)
            return url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError("the server did not start")


def test_clients_that_never_finish_their_headers_starve_no_one_and_are_closed():
    url = _backend(header_timeout_s=1.0)
    port = int(url.rsplit(":", 1)[1])
    slow = []
    for _ in range(80):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        slow.append(connection)
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200  # answered, not 503, however busy the machine
    deadline = time.monotonic() + 30  # each is closed once its second without headers is over
    closed = 0
    for connection in slow:
        connection.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            closed += connection.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass  # still open
        connection.close()
    assert closed == len(slow)


def test_connections_past_the_limit_are_answered_503_at_once_until_the_idle_ones_are_closed(monkeypatch):
    """The limit bounds what one client can hold: past it a request is refused at once, not queued, and once the
    server has closed the idle connections (its header timeout) it answers again while their client still holds them."""
    import crackseg.integrations.server as server

    monkeypatch.setattr(server, "MAX_CONNECTIONS", 8)
    url = _backend(header_timeout_s=1.0)
    port = int(url.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
    try:
        time.sleep(0.2)  # the server has accepted them
        assert httpx.get(f"{url}/health", timeout=5).status_code == 503
        time.sleep(2.0)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        for connection in idle:
            connection.close()


def test_a_body_that_never_arrives_times_out_and_deep_json_is_a_400(caplog):
    url = _backend(body_timeout_s=1.0)
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ta")
        connection.settimeout(10)
        answer = b""
        while b"did not arrive" not in answer and (chunk := connection.recv(4096)):  # headers and body may come apart
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408") and "did not arrive within 1 s" in answer
    deep = b'{"tasks": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    caplog.set_level(logging.DEBUG)
    for route in ("predict", "setup", "webhook"):
        answer = httpx.post(f"{url}/{route}", content=deep, headers={"content-type": "application/json"}, timeout=10)
        assert answer.status_code == 400, route
        assert answer.json() == {"error": "the request body nests 5001 levels deep, more than the 64 crackseg reads"}, route
    assert not [record for record in caplog.records if record.exc_info or "Traceback" in record.getMessage()]
    assert json.loads(httpx.get(f"{url}/health", timeout=5).text)["status"] == "UP"


def test_nesting_leaves_strings_out_whatever_their_escapes_and_a_body_of_escaped_quotes_is_read_in_time():
    """Brackets inside strings do not count, a quote after an odd run of backslashes stays inside its string. A body
    of 200 kB of escaped quotes, with no end to its string, took minutes to scan; with the client's 30 s it is a 400."""
    from crackseg.integrations.server import _nesting

    def depth(value) -> int:
        return 1 + max(map(depth, value.values() if isinstance(value, dict) else value), default=0) if isinstance(value, (dict, list)) else 0

    documents = [{}, [], {"a": "[[[", "b": [1, [2, {"c": "\\"}]]}, ['\\"[', ["x\\\\"], "]]"], "plain", [[['\\\\\\"]']]], {"[": {"{": []}}]
    for document in documents:
        text = json.dumps(document)
        assert _nesting(text.encode()) == depth(document), text
    assert _nesting(b'["a\\\\"]]') == 1  # the string ends after the escaped backslash: the second ] closes nothing open
    url = _backend()
    answer = httpx.post(f"{url}/predict", content=b'"' + b'\\"' * 100_000, headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]


def _self_signed(folder) -> tuple[str, str]:
    """(certificate, key) files for 127.0.0.1, the certificate its own authority."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def _trickling_server(at_once: bytes, trickled: bytes, pause_s: float, tls: tuple[str, str] | None = None):
    """A loopback server that answers every connection with ``at_once``, then ``trickled`` a byte every ``pause_s``,
    then holds it open; over TLS with ``tls`` (certificate, key)."""
    import ssl

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    context = None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)

    def answer(connection):
        with contextlib.suppress(OSError), connection:
            if context is not None:
                connection = context.wrap_socket(connection, server_side=True)
            connection.recv(4096)
            connection.sendall(at_once)
            for byte in trickled:
                if stop.wait(pause_s):
                    return
                connection.sendall(bytes([byte]))
            stop.wait(60)

    def accept():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                threading.Thread(target=answer, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", stop, listener


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("at_once, trickled", [
    (b"", b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n" * 10),  # headers that never end
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"x" * 100),  # a body without a length, that a close would end
])
def test_the_fetch_deadline_covers_headers_and_bodies_a_host_sends_a_byte_at_a_time(tmp_path, monkeypatch, scheme, at_once, trickled):
    tls = _self_signed(tmp_path) if scheme == "https" else None
    if tls:
        monkeypatch.setenv("SSL_CERT_FILE", tls[0])
    host, stop, listener = _trickling_server(at_once, trickled, 0.1, tls)
    try:
        fetcher = ImageFetcher(None, None, (host,), 1 << 20, 1.0)  # each byte within the read timeout, the whole not
        started = time.monotonic()
        with pytest.raises(HttpError) as refused:
            fetcher.fetch(f"{scheme}://{host}/slow.png", "task 1")
        assert refused.value.status_code == 504 and refused.value.detail == "task 1: the image did not arrive within 1 s"
        assert time.monotonic() - started < 5  # the trickle alone lasts 4 to 10 s, the server holds on after
    finally:
        stop.set()
        listener.close()


def test_the_fetch_deadline_covers_the_exchange_of_a_personal_access_token():
    claims = base64.urlsafe_b64encode(json.dumps({"token_type": "refresh"}).encode()).decode().rstrip("=")
    host, stop, listener = _trickling_server(b"", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 10, 0.1)
    try:
        fetcher = ImageFetcher(f"http://{host}", f"header.{claims}.signature", (), 1 << 20, 1.0)
        started = time.monotonic()
        with pytest.raises(HttpError) as refused:
            fetcher.fetch(f"http://{host}/data/upload/1/a.png", "task 1")  # Label Studio's own: the token is exchanged first
        assert refused.value.status_code == 504 and refused.value.detail == "task 1: the image did not arrive within 1 s"
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("url, reason", [("http://[::1/x.png", "Invalid IPv6 URL"), ("http://127.0.0.1:99999/x.png", "out of range"),
                                         ("http://127.0.0.1:80/x.png\x00", "control character '\\x00'"), ("http://host:8O/x.png", ""),
                                         ("http://exa\x00mple.com/a.png", "control character '\\x00'"),
                                         ("http://a b/x.png", "host 'a b' holds ' '")])
def test_a_url_that_does_not_parse_is_the_task_s_422(url, reason):
    fetcher = ImageFetcher(None, None, ("127.0.0.1", "host"), 1 << 20, 5.0)
    with pytest.raises(HttpError) as refused:
        fetcher.fetch(url, "task 3")
    assert refused.value.status_code == 422 and refused.value.detail.startswith("task 3: not a URL crackseg can fetch (")
    assert reason in refused.value.detail
