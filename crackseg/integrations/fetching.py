"""Task images fetched for the Label Studio backend, safely: where from, with which credentials, how far.

A task's image URL comes from whoever can create tasks, so it is not trusted:

- **Where**: Label Studio's own origin (``LABEL_STUDIO_URL``'s scheme, host and port) and the hosts the operator lists
  (``--allow-host HOST`` or ``HOST:PORT``) are fetched from whatever their address; any other URL, another port of
  Label Studio's host included, only when every address its host resolves to is public (not
  loopback, link-local, private, shared, multicast or reserved), so a task cannot make the backend read its own
  machine, the cloud's metadata service or the internal network. Redirects are followed by hand, at most
  :data:`MAX_REDIRECTS`, and every hop is checked the same way; the address the connection reached is checked again.
- **Credentials**: ``LABEL_STUDIO_API_KEY`` goes only to Label Studio's exact origin (scheme, host and port), never to
  the same host over plain http or another port, and never across a redirect to another origin.
- **How far**: the body is read no further than ``--max-image-mb``, and the whole fetch (redirects, response headers
  and the exchange of a personal access token included) ends at ``ServerSettings.fetch_timeout_s``: a host that sends
  a byte at a time holds a task slot no longer.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ipaddress
import json
import os
import socket
import threading
from urllib.parse import urljoin, urlsplit

import httpx
from starlette.exceptions import HTTPException

from crackseg.core.urls import url_problem
from crackseg.integrations.options import host_key

MAX_REDIRECTS = 5
_REFRESH_PATH = "/api/token/refresh/"  # where Label Studio exchanges a personal access token for an access token
_DEFAULT_PORTS = {"http": 80, "https": 443}


class HttpError(HTTPException):
    """A request or task that gets an HTTP error status and a one-line reason (``detail``)."""


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port filled in from the scheme: what a token is bound to."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(parts.scheme.lower())


def public_address(address: str) -> bool:
    """Whether an IP address is on the public internet (not loopback, link-local, private, shared, multicast, ...)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class ImageFetcher:
    """Image bytes over HTTP, with Label Studio's credentials for its own origin only; thread-safe."""

    def __init__(self, label_studio_url: str | None, api_key: str | None, allowed_hosts: tuple[str, ...],
                 max_bytes: int, timeout_s: float):
        self._url, self._key, self._max_bytes = label_studio_url, api_key, max_bytes
        self._allowed = {host.lower() for host in allowed_hosts}
        # a connection per fetch, so that the deadline knows every socket a fetch reads from
        # and straight to the image's host, never through a proxy (HTTP_PROXY, ...): the peer checked is the host's address;
        # the CA certificates SSL_CERT_FILE or SSL_CERT_DIR name are still trusted
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0),
                                    trust_env=False, verify=httpx.create_ssl_context(trust_env=True))
        self._timeout_s = timeout_s
        self._refreshable = _jwt_claims(api_key or "").get("token_type") == "refresh"  # a personal access token
        self._access: str | None = None  # the access token it was exchanged for
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def trusted(self, url: str) -> bool:
        """Whether ``url`` may be fetched whatever its host's address: Label Studio's origin, or an allowed host."""
        _, host, port = origin(url)
        return self.own(url) or host in self._allowed or host_key(host, port) in self._allowed

    def own(self, url: str) -> bool:
        """Whether ``url`` is on Label Studio's exact origin, the one its API key is for."""
        return self._url is not None and origin(url) == origin(self._url)

    def fetch(self, url: str, where: str) -> bytes:
        with _Deadline(self._timeout_s, f"{where}: the image did not arrive within {self._timeout_s:g} s") as deadline:
            status, content = self._follow(url, where, deadline)
            if status == 401 and self._refreshable and self.own(url):  # the access token expired
                status, content = self._follow(url, where, deadline, renew=True)
        if status in (401, 403):
            advice = "check LABEL_STUDIO_API_KEY" if self.own(url) else "crackseg sends LABEL_STUDIO_API_KEY only to LABEL_STUDIO_URL's origin"
            raise HttpError(403, f"{where}: refused ({status}); {advice}")
        if status == 404:
            raise HttpError(404, f"{where}: not found (404)")
        if status != 200:
            raise HttpError(502, f"{where}: answered {status}")
        return content

    def _follow(self, url: str, where: str, deadline: _Deadline, renew: bool = False) -> tuple[int, bytes]:
        """(status, body) at the end of at most MAX_REDIRECTS redirects, each hop checked and credentialed on its own."""
        for _ in range(MAX_REDIRECTS + 1):
            _check_url(url, where)
            self._check_host(url, where)
            headers = self._authorization(where, deadline, renew) if self.own(url) else {}
            status, content, location = self._get(url, headers, where, deadline)
            if location is None:
                return status, content
            url = urljoin(url, location)
        raise HttpError(502, f"{where}: more than {MAX_REDIRECTS} redirects")

    def _check_host(self, url: str, where: str) -> None:
        scheme, host, port = origin(url)
        if scheme not in _DEFAULT_PORTS or not host:
            raise HttpError(422, f"{where}: crackseg fetches http(s) URLs only")
        if self.trusted(url):
            return
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except (socket.gaierror, UnicodeError) as error:
            raise HttpError(502, f"{where}: cannot resolve {host}: {error}") from None
        private = sorted(address for address in addresses if not public_address(address))
        if private:
            raise HttpError(403, f"{where}: {host}:{port} is at a non-public address ({private[0]}); crackseg fetches task images "
                                 "from public hosts, LABEL_STUDIO_URL's origin and the hosts given with --allow-host")

    def _get(self, url: str, headers: dict, where: str, deadline: _Deadline) -> tuple[int, bytes, str | None]:
        """(status, body, redirect location), the body read no further than the image size limit."""
        too_large = HttpError(422, f"{where}: image over {self._max_bytes} bytes (crackseg serve label-studio --max-image-mb)")
        try:
            with self._client.stream("GET", url, headers=headers, extensions={"trace": deadline.trace}) as response:
                self._check_peer(response, url, where)
                if response.is_redirect and response.headers.get("location"):
                    return response.status_code, b"", response.headers["location"]
                if response.status_code != 200:
                    return response.status_code, b"", None
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self._max_bytes:
                    raise too_large
                content = bytearray()
                for chunk in response.iter_bytes():
                    content += chunk
                    if len(content) > self._max_bytes:
                        raise too_large
                deadline.check()  # a body without a length ends, cut short, where the deadline shut its connection
                return 200, bytes(content), None
        except httpx.InvalidURL as error:
            raise HttpError(422, f"{where}: not a URL crackseg can fetch ({error})") from None
        except httpx.HTTPError as error:
            deadline.check()
            raise HttpError(502, f"{where}: cannot fetch: {type(error).__name__} {error}".rstrip()) from None

    def _check_peer(self, response: httpx.Response, url: str, where: str) -> None:
        """The address the connection reached, checked again: a name that resolved to a public address when checked
        and to a private one when connecting (DNS rebinding) is refused before its body is read."""
        stream = response.extensions.get("network_stream")
        peer = stream.get_extra_info("server_addr") if stream is not None else None
        if peer and not self.trusted(url) and not public_address(str(peer[0])):
            raise HttpError(403, f"{where}: {origin(url)[1]} connected to a non-public address ({peer[0]})")

    def _authorization(self, where: str, deadline: _Deadline, renew: bool = False) -> dict:
        key = self._key
        if not key:
            raise HttpError(403, f"{where} is served by Label Studio; set LABEL_STUDIO_API_KEY (Account & Settings > Access Token)")
        if not self._refreshable:  # a legacy token, or a JWT access token used as it is
            return {"Authorization": f"{'Bearer' if _jwt_claims(key) else 'Token'} {key}"}
        with self._lock:
            if self._access is None or renew:
                self._access = self._exchanged(key, deadline)
            return {"Authorization": f"Bearer {self._access}"}

    def _exchanged(self, refresh: str, deadline: _Deadline) -> str:
        """The access token Label Studio gives for a personal access token, within the deadline of the fetch that needs it."""
        url = self._url.rstrip("/") + _REFRESH_PATH
        try:
            response = self._client.post(url, json={"refresh": refresh}, extensions={"trace": deadline.trace})
        except httpx.HTTPError as error:
            deadline.check()
            raise HttpError(502, f"cannot reach {url} to exchange LABEL_STUDIO_API_KEY: {type(error).__name__}") from None
        access = response.json().get("access") if response.status_code == 200 and _is_json(response) else None
        if not isinstance(access, str) or not access:
            raise HttpError(403, f"Label Studio refused LABEL_STUDIO_API_KEY at {url} ({response.status_code}); "
                                 "create a new personal access token")
        return access


class _Deadline:
    """One fetch's time limit, redirects, TLS handshakes and response headers included. At the limit the connections the
    fetch opened are shut, which ends a read that a host keeps alive with a byte at a time, and :meth:`check` raises
    ``expired``. Each connection is held by a duplicate of its descriptor: shutting it shuts the connection, whatever
    wraps it by then (TLS takes the plain socket's descriptor over)."""

    def __init__(self, seconds: float, expired: str):
        self._expired, self._passed, self._sockets = expired, False, []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()  # the duplicate only

    def trace(self, event: str, info: dict) -> None:
        """httpx's trace hook: each new connection, shut at once if the limit has passed."""
        if event == "connection.connect_tcp.complete":
            with self._lock:
                connection = info["return_value"].get_extra_info("socket")
                self._sockets.append(socket.socket(fileno=os.dup(connection.fileno())))
                if self._passed:
                    self._shut(self._sockets[-1])

    def check(self) -> None:
        if self._passed:
            raise HttpError(504, self._expired)

    def _expire(self) -> None:
        with self._lock:
            self._passed = True
            for sock in self._sockets:
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the host closed it already
            sock.shutdown(socket.SHUT_RDWR)


def _check_url(url: str, where: str) -> None:
    """A URL that does not parse as the task's error."""
    problem = url_problem(url)
    if problem is not None:
        raise HttpError(422, f"{where}: not a URL crackseg can fetch ({problem})")


def _is_json(response: httpx.Response) -> bool:
    try:
        return isinstance(response.json(), dict)
    except ValueError:
        return False


def _jwt_claims(token: str) -> dict:
    """A JWT's claims, unverified (only to tell a personal access token from a legacy one); {} if not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}
