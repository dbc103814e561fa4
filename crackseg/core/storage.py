"""Files in object storage: ``s3://bucket/key`` and ``http(s)://`` URLs, listed and read through fsspec; s3:// written.

s3:// goes through s3fs (botocore): credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws``, an instance role), an S3-compatible endpoint (MinIO, Ceph,
R2) from ``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3``, which botocore reads itself. Transient failures are retried by
botocore's standard retry mode: 3 attempts with jittered exponential backoff unless ``AWS_MAX_ATTEMPTS`` says otherwise.
http(s):// is read-only, one file per URL (a presigned URL works as given); it is retried as often, with the same backoff.
An s3:// object is written whole (:func:`upload_file`) or only if absent (:func:`create_if_absent`), never streamed.
Rasters are read by GDAL itself, by ranged requests (:func:`gdal_path`), configured from the same variables
(:func:`gdal_options`).

Every failure is a :class:`StorageError`: one line naming the URL as :func:`display_url` shows it (no user, password or
query string, where presigned URLs carry their signature and access key id) and a reason, never a credential.
fsspec, s3fs and aiohttp are imported on first use; ``pip install 'crackseg[s3]'`` installs them.
"""

from __future__ import annotations

import copy
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Mapping, Sequence, TypeVar
from urllib.parse import unquote, urlsplit

from crackseg.core.errors import InputError, require
from crackseg.core.urls import display_url, scrubbed, url_problem

EXTRA = "s3"
SCHEMES = ("s3", "http", "https")
HTTP_ATTEMPTS = 3  # as botocore's standard mode, for http(s):// reads
HTTP_TIMEOUTS_S = {"connect": 10.0, "sock_read": 60.0}  # a dropped connection fails instead of hanging
_BOTOCORE_CONFIG = {"retries": {"mode": "standard"}}  # max_attempts: AWS_MAX_ATTEMPTS or the profile's, else 3
_GLOB = re.compile(r"[*?\[]")
_T = TypeVar("_T")
_GDAL_READING = {  # GDAL's defaults otherwise: what a tiled raster read by windows from a store needs
    "GDAL_HTTP_MAX_RETRY": str(HTTP_ATTEMPTS - 1),  # 429 and 5xx answers, as the http(s):// reads here
    "GDAL_HTTP_RETRY_DELAY": "1",  # seconds, doubled at each retry
    "GDAL_HTTP_CONNECTTIMEOUT": str(int(HTTP_TIMEOUTS_S["connect"])),
    "GDAL_HTTP_LOW_SPEED_TIME": str(int(HTTP_TIMEOUTS_S["sock_read"])),  # a dropped connection fails instead of hanging
    "GDAL_HTTP_LOW_SPEED_LIMIT": "1",  # bytes per second, over LOW_SPEED_TIME
    "VSI_CACHE": "TRUE",  # a per-file cache of the byte ranges read (25 MB), so overlapping windows fetch them once
}


class StorageError(InputError):
    """A file in storage that cannot be listed or read: ``reason`` alone goes to errors.csv beside the URL."""

    def __init__(self, url: str, reason: str):
        self.url, self.reason = display_url(url), reason
        super().__init__(f"{self.url}: {reason}")


class UnsupportedByStore(StorageError):
    """A request the store does not implement (HTTP 501), such as a conditional write on some S3-compatible stores."""


@dataclass(frozen=True)
class RemoteFile:
    """A file in storage, named by its full URL (kept for reading, never shown: ``str()`` is :func:`display_url`).

    Only text is held, so it pickles into loader workers, which open their own connections.
    """

    url: str

    def __str__(self) -> str:
        return display_url(self.url)

    def __repr__(self) -> str:
        return f"RemoteFile({str(self)!r})"

    @property
    def name(self) -> str:
        """The last part of the key or path, decoded (``my%20photo.jpg`` -> ``my photo.jpg``)."""
        path = self.url.split("://", 1)[1].partition("/")[2] if _scheme(self.url) == "s3" else unquote(urlsplit(self.url).path)
        return PurePosixPath(path).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    def check_readable(self) -> None:
        """Raise the :class:`StorageError` that says why the file cannot be read (missing, denied, unreachable), if any:
        GDAL's own messages for these are terse, and may not name the cause."""
        limit = {} if _scheme(self.url) == "s3" else {"timeout": HTTP_TIMEOUTS_S["sock_read"]}  # its HEAD and GET together
        _call(self.url, lambda fs: fs.info(self.url, **limit))

    def read_bytes(self) -> bytes:
        """The whole file, in one GET (s3fs would first ask for the size, to fetch files over 50 MB in parallel parts)."""
        single = {"max_concurrency": 1} if _scheme(self.url) == "s3" else {}
        return _call(self.url, lambda fs: fs.cat_file(self.url, **single))

    def read_head(self, size: int) -> bytes:
        """The file's first ``size`` bytes (all of a smaller file), in one ranged GET."""
        return _call(self.url, lambda fs: fs.cat_file(self.url, start=0, end=size))


def gdal_path(url: str) -> str:
    """The name GDAL reads ``url`` by, window by window through ranged GETs, never whole: ``/vsis3/bucket/key`` for
    s3:// (credentials from the AWS chain, GDAL's own), ``/vsicurl/URL`` for http(s)://."""
    if _scheme(url) == "s3":
        return "/vsis3/" + url.split("://", 1)[1]
    return "/vsicurl/" + url


def gdal_options(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """GDAL's configuration options for reading rasters from the store as s3fs does: GDAL ignores ``AWS_ENDPOINT_URL``
    (and ``AWS_ENDPOINT_URL_S3``), so it becomes ``AWS_S3_ENDPOINT`` (host[:port]), ``AWS_HTTPS`` (from its scheme) and
    path-style requests (``AWS_VIRTUAL_HOSTING=FALSE``, as MinIO and moto need). An option the environment sets itself
    is left to it (GDAL reads its options from the environment too)."""
    options = dict(_GDAL_READING)
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        options |= {"AWS_S3_ENDPOINT": parts.netloc.rpartition("@")[2] + parts.path.rstrip("/"),
                    "AWS_HTTPS": "NO" if parts.scheme == "http" else "YES", "AWS_VIRTUAL_HOSTING": "FALSE"}
    return {name: value for name, value in options.items() if name not in environ}


def list_files(url: str, suffixes: Sequence[str], recursive: bool = False) -> list[tuple[RemoteFile, str]]:
    """The files ``url`` names, each with its output name, in key order, as predict names local inputs.

    A prefix (``s3://bucket/photos/``, or a key with objects below it) gives its files with one of ``suffixes``, named by
    their key below the prefix without suffix (keys under sub-prefixes only when ``recursive``). A glob pattern
    (``s3://bucket/photos/*.jpg``) gives its matches with ``suffixes``, an object or an http(s) URL itself, named by stem.
    A key or prefix that exists is taken as it is, whatever it holds: ``s3://bucket/survey [2024]/`` is that prefix.
    """
    scheme = _scheme(url)
    if scheme != "s3":
        RemoteFile(url).check_readable()  # a missing file or a refused request is said now, before any work
        return [(RemoteFile(url), RemoteFile(url).stem)]
    root = url.split("://", 1)[1].rstrip("/")
    if _GLOB.search(root) and not _call(url, lambda fs: fs.exists(url)):  # a key or prefix holding [, * or ? is itself
        matches = _call(url, lambda fs: fs.glob(url, detail=True))
        return [(RemoteFile(f"s3://{key}"), PurePosixPath(key).stem) for key, info in sorted(matches.items())
                if info["type"] == "file" and PurePosixPath(key).suffix.lower() in suffixes]
    if "/" in root and not url.endswith("/") and _call(url, lambda fs: fs.info(url))["type"] == "file":
        return [(RemoteFile(url), RemoteFile(url).stem)]
    if recursive:
        keys = _call(url, lambda fs: fs.find(root))
    else:  # not find(maxdepth=1), which says nothing of a missing bucket
        keys = [info["name"] for info in _call(url, lambda fs: fs.ls(root, detail=True)) if info["type"] == "file"]
    return [(RemoteFile(f"s3://{key}"), _name_below(root, key)) for key in sorted(keys, key=lambda key: PurePosixPath(key).parts)
            if PurePosixPath(key).suffix.lower() in suffixes]  # in a local folder's order: by path part, a/b before a-b


def list_keys(url: str) -> list[str]:
    """The keys of every object below the s3:// prefix ``url``, relative to it, sorted; a missing bucket is an error."""
    root = _s3_path(url)
    found = _call(url, lambda fs: fs.find(root))  # find, unlike ls, says when the bucket is missing
    return sorted(key[len(root) + 1:] for key in found if key.startswith(root + "/"))


def upload_file(path: Path, url: str) -> None:
    """``path`` as the object ``url``, whole: s3fs sends one PUT up to twice its part size (50 MiB), else a multipart upload
    that it aborts when a part fails, so readers see the complete file or the object as it was, never a part."""
    _call(url, lambda fs: fs.put_file(str(path), _s3_path(url)))


def answers(url: str) -> bool:
    """Whether the store of the s3:// ``url`` answers at all: one request for its bucket (retried as every request)."""
    bucket = _s3_path(url).split("/", 1)[0]
    try:
        _call(url, lambda fs: fs.info(bucket))
        return True
    except StorageError:
        return False


def create_if_absent(url: str, data: bytes) -> bool:
    """Write ``data`` as the object ``url`` only if no object has that key (``If-None-Match: *``, atomic on the store);
    False when one has. A store that cannot write conditionally (HTTP 501) raises :class:`UnsupportedByStore`."""
    def create(fs) -> bool:
        try:
            fs.pipe_file(_s3_path(url), data, mode="create")
            return True
        except FileExistsError:  # s3fs's name for 412 PreconditionFailed on If-None-Match
            return False
        except OSError as error:
            codes = {_error_code(cause) for cause in _chain(error)}
            if codes & {"NotImplemented", "501"}:
                raise UnsupportedByStore(url, "the store does not support conditional writes (If-None-Match: *)") from None
            if codes & {"ConditionalRequestConflict", "409"}:  # another writer is creating the same key now
                return False
            raise
    return _call(url, create)


def delete_file(url: str) -> None:
    """Remove the object ``url`` (no error when it is gone already)."""
    _call(url, lambda fs: fs.rm_file(_s3_path(url)))


def _s3_path(url: str) -> str:
    """``bucket/key`` of an s3:// URL, as s3fs names objects; other schemes are refused (they are read-only)."""
    if _scheme(url) != "s3":
        raise StorageError(url, "only s3:// URLs can be written; http(s):// is read-only")
    return url.split("://", 1)[1].rstrip("/")


def _name_below(root: str, key: str) -> str:
    """The output name of ``key`` listed under ``root``: its path below, without suffix; a key whose path would leave
    the output folder, or name a file with no name, is refused."""
    relative = key[len(root) + 1:]
    if any(part in ("", ".", "..") for part in relative.split("/")):
        raise StorageError(f"s3://{key}", "a key with an empty, '.' or '..' part cannot name an output file; copy it to a plain key")
    return PurePosixPath(relative).with_suffix("").as_posix()


def _scheme(url: str) -> str:
    problem = url_problem(url)
    if problem is not None:
        raise StorageError(url, f"not a valid URL ({problem})")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise StorageError(url, f"{scheme}:// is not supported; crackseg reads local paths, s3:// and http(s):// URLs")
    return scheme


def _filesystem(scheme: str):
    """fsspec's filesystem for ``scheme``: one per process and thread (fsspec's cache), so loader workers get their own."""
    fsspec = require("fsspec", EXTRA, "reading s3:// and http(s):// URLs")
    loop = require("fsspec.asyn", EXTRA, "reading s3:// and http(s):// URLs").get_loop()
    if loop.get_exception_handler() is None:
        loop.set_exception_handler(_unless_connection_lost)
    if scheme == "s3":
        require("s3fs", EXTRA, "reading s3:// URLs")
        config = copy.deepcopy(_BOTOCORE_CONFIG)  # botocore writes the attempts it resolved into the dict given
        filesystem = fsspec.filesystem("s3", config_kwargs=config, use_listings_cache=False)
        filesystem.retries = 1  # s3fs would repeat botocore's attempts up to 5 times over: a dead endpoint took minutes
        return filesystem
    aiohttp = require("aiohttp", EXTRA, "reading http(s):// URLs")
    return fsspec.filesystem("https", encoded=True, client_kwargs={"timeout": aiohttp.ClientTimeout(**HTTP_TIMEOUTS_S)})


def _unless_connection_lost(loop, context: dict) -> None:
    """fsspec's event loop reports what its tasks raised that nobody awaited, as the default does, except a connection
    lost in a request that failed anyway: that request's error is the one said, once."""
    error = context.get("exception")
    if error is None or not {kind.__name__ for kind in type(error).__mro__} & _CONNECTIONS:
        loop.default_exception_handler(context)


def _call(url: str, action: Callable[[object], _T]) -> _T:
    """``action(filesystem)``, its failures as one :class:`StorageError` naming ``url``; http(s) retried when transient."""
    scheme = _scheme(url)
    attempts = 1 if scheme == "s3" else HTTP_ATTEMPTS  # botocore retries s3:// itself
    attempt = 1
    while True:
        try:
            return action(_filesystem(scheme))
        except InputError:
            raise
        except Exception as error:
            reason, transient = _reason(error, url)
            if reason is None:
                raise  # not a storage failure: a bug, shown with its traceback
            if not transient or attempt == attempts:
                raise StorageError(url, reason + (f" ({attempt} attempts)" if attempt > 1 else "")) from None
        time.sleep(random.uniform(0, 2 ** (attempt - 1)))  # "full jitter", as botocore's standard mode
        attempt += 1


_DENIED = "access denied: the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws, an instance role) may not read it"
_S3_CODES = {  # botocore's error codes (Head requests have no body, so only the HTTP status) -> what to check
    "NoSuchKey": "not found",
    "404": "not found",
    "NotFound": "not found",
    "AccessDenied": _DENIED,
    "403": _DENIED,
    "InvalidAccessKeyId": "the endpoint does not know the access key id (check AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws, AWS_ENDPOINT_URL)",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id (check AWS_SECRET_ACCESS_KEY, ~/.aws)",
    "ExpiredToken": "the session token has expired: renew the credentials",
    "InvalidToken": "the session token is not valid: renew the credentials",
}
_TIMEOUTS = {"TimeoutError", "ConnectTimeoutError", "ReadTimeoutError", "FSTimeoutError", "ServerTimeoutError"}
_CONNECTIONS = {"EndpointConnectionError", "ClientConnectionError", "ConnectionError", "ConnectionClosedError",
                "ServerDisconnectedError", "ClientPayloadError", "IncompleteRead"}
_CREDENTIALS = {
    "NoCredentialsError": "no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or use ~/.aws",
    "PartialCredentialsError": "incomplete AWS credentials: set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "ProfileNotFound": "the AWS profile named by AWS_PROFILE is not in ~/.aws/config",
}


def _reason(error: BaseException, url: str) -> tuple[str | None, bool]:
    """(why ``error`` happened, for a user, and whether trying again may help); (None, False) for what is no storage
    failure. The chain is searched for the most telling cause: fsspec wraps what aiohttp and botocore raise."""
    chain = _chain(error)
    for cause in chain:
        names = {kind.__name__ for kind in type(cause).__mro__}
        response = getattr(cause, "response", None)
        code = _error_code(cause)
        if "TooManyRedirects" in names:  # aiohttp's, a ClientResponseError without a status of its own
            return f"too many redirects: the server sends it on and on (a redirect loop?), {len(cause.history)} followed", False
        if "ClientResponseError" in names:  # aiohttp: an http(s):// answer
            status = cause.status
            why = {404: "not found (HTTP 404)", 401: "access denied (HTTP 401)",
                   403: "access denied (HTTP 403; a presigned URL may have expired)"}.get(status, f"the server answered HTTP {status}")
            return why, status >= 500 or status == 429
        if code == "NoSuchBucket":
            return f"no such bucket {urlsplit(url).netloc!r}", False
        if code in _S3_CODES:
            return _S3_CODES[code], False
        if isinstance(response, dict) and "HTTPStatusCode" in response.get("ResponseMetadata", {}):  # botocore, retried
            meta, named = response["ResponseMetadata"], f" ({code})" if code and not code.isdigit() else ""
            return f"the endpoint answered HTTP {meta['HTTPStatusCode']}{named} ({meta.get('RetryAttempts', 0) + 1} attempts)", False
        check = "check AWS_ENDPOINT_URL and the network" if url.startswith("s3://") else "check the host and the network"
        if names & _TIMEOUTS:
            return f"timed out: {check}", True
        if names & _CONNECTIONS:
            return f"cannot connect to {_endpoint(cause, url)}: {check}", True
        credentials = names & set(_CREDENTIALS)
        if credentials:
            return _CREDENTIALS[credentials.pop()], False
    outer = chain[0]
    if isinstance(outer, FileNotFoundError):
        return "not found", False
    if isinstance(outer, PermissionError):
        return _DENIED, False
    if isinstance(outer, OSError) or {"BotoCoreError", "ClientError"} & {kind.__name__ for kind in type(outer).__mro__}:
        return f"cannot read: {scrubbed(str(outer))}", False
    return None, False


def _chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling, outermost first."""
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _error_code(error: BaseException) -> str:
    """botocore's error code of ``error`` (``NoSuchBucket``, or the HTTP status for bodiless answers), else ''."""
    response = getattr(error, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _endpoint(error: BaseException, url: str) -> str:
    """The endpoint a connection failed to reach, from botocore's error or aiohttp's, else the URL's host."""
    details = getattr(error, "kwargs", None)  # botocore keeps what its message was made of
    endpoint = details.get("endpoint_url") if isinstance(details, dict) else None
    if endpoint:
        parts = urlsplit(endpoint)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    host = getattr(error, "host", None)
    return f"{host}:{error.port}" if host else urlsplit(url).netloc.rpartition("@")[2]
