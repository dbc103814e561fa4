"""URLs as text: told apart from local paths, shown without their credentials, checked to parse. No network."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]+)://[^\s'\"<>]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NOT_IN_HOSTS = re.compile(r"[\s<>\"'{}|\\^`%/?#@]")  # what no host name, IDNA or bracketed IPv6 address holds
_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL (``scheme://...``) rather than a local path; any scheme, so that gs:// is refused by name."""
    return _URL.match(str(text)) is not None


def shown_location(text: str) -> str:
    """A local path or a URL as a run's last line names where it wrote: a URL as :func:`display_url` shows it, without
    its trailing slash."""
    return display_url(text).rstrip("/") if is_url(text) else str(Path(text))


def display_url(url: str) -> str:
    """``url`` as logs, tables and errors show it: without user and password, and for http(s) without the query and
    fragment (a presigned URL's signature, access key id and session token). s3:// keys may hold ``?`` and ``#``."""
    if not is_url(url):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracket left open: the user goes from the authority, and a presigned query with the rest
        scheme, rest = url.split("://", 1)
        authority, slash, path = rest.partition("/")
        return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}".split("?", 1)[0].split("#", 1)[0]
    host = parts.netloc.rpartition("@")[2]
    if parts.scheme in ("http", "https"):
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    return f"{parts.scheme}://{host}{url.split('://', 1)[1][len(parts.netloc):]}"


def url_problem(url: str) -> str | None:
    """Why ``url`` does not parse (a bracket left open, a port that is no number or out of range, a host with a space or
    a character no host name holds, an http(s) URL with a control character); None when it does. An s3:// key may hold
    any character."""
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as error:
        return str(error)
    control = _CONTROL.search(url) if parts.scheme in ("http", "https") else None
    if control:
        return f"control character {control.group()!r}"
    odd = _NOT_IN_HOSTS.search(parts.hostname or "")
    return f"host {parts.hostname!r} holds {odd.group()!r}" if odd else None


def scrubbed(text: str) -> str:
    """A message from a library, safe to show: its URLs as :func:`display_url` shows them, no credential of the
    environment's (servers do not echo secrets, but a message is not trusted to know that)."""
    text = _URL.sub(lambda match: display_url(match.group()), text)
    for variable in _CREDENTIAL_VARIABLES:
        secret = os.environ.get(variable)
        if secret:
            text = text.replace(secret, "***")
    return " ".join(text.split())
