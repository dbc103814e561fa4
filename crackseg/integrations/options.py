"""The options of ``crackseg serve label-studio``; no torch."""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from crackseg.core.errors import InputError
from crackseg.core.options import AT_LEAST_ONE, FRACTION, POSITIVE, REQUIRED, Options, Range, group, option
from crackseg.prediction.options import InferenceOptions, model_file

DEFAULT_PORT = 9090  # label-studio-ml-backend's port


def allowed_host(text: str) -> str:
    """``host`` or ``host:port`` as the image fetcher compares them (:func:`host_key`): lower case, an IPv6 address
    bracketed only before a port; a URL, a path or a bad port is refused, since it would never match."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(text))  # a bare address, IPv6 included
    try:
        parts = urlsplit("//" + text)
        port = parts.port
    except ValueError:  # a bad port, an unclosed bracket
        parts, port = None, None
    if parts is None or not parts.hostname or set("/@?# \t") & set(text):
        raise ValueError(f"{text!r}: give a host or host:port, e.g. files.internal or 10.0.0.5:8000 ([::1]:8000 "
                         "for IPv6), without a scheme or a path")
    return host_key(parts.hostname, port)


def host_key(host: str, port: int | None = None) -> str:
    """How an allowed host is written: ``host``, ``host:port``, ``[v6]:port``."""
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ServeOptions(Options):
    """``crackseg serve label-studio``: the model, where to listen, what to take; secrets come from the environment."""

    checkpoint: Path = option(REQUIRED, "model file: a .pt, safetensors folder, .onnx or .xml, or a shipped model's name "
                                        "(crackseg models)", parse=model_file)
    threshold: float | None = option(None, "crack probability threshold (default: the checkpoint's best validation F1 threshold)",
                                     valid=FRACTION)
    host: str = option("127.0.0.1", "address to listen on; 0.0.0.0 for Label Studio on another machine or in Docker (then set "
                                    "basic auth)")
    port: int = option(DEFAULT_PORT, "port to listen on; 0 picks a free one (printed)", valid=Range(0, 65535))
    label_studio_url: str | None = option(None, "Label Studio's address, for the images it serves (default: $LABEL_STUDIO_URL)",
                                          env="LABEL_STUDIO_URL")
    allow_host: tuple[str, ...] = option((), "a host (or host:port) task images may be fetched from whatever its address, "
                                             "e.g. a file server on the internal network; give it once per host (public "
                                             "hosts and LABEL_STUDIO_URL's need none)", repeat=True, metavar="HOST",
                                         parse=allowed_host)
    basic_auth_user: str | None = option(None, "basic-auth user every request must give, with the password in $BASIC_AUTH_PASS "
                                               "(default: $BASIC_AUTH_USER); enter both in Label Studio's model settings",
                                         env="BASIC_AUTH_USER")
    max_request_mb: float = option(16.0, "MiB: largest request body taken; larger ones get 413", unit="MiB", valid=POSITIVE)
    max_image_mb: float = option(64.0, "MiB: largest image file fetched; a larger one is an error for its task", unit="MiB",
                                 valid=POSITIVE)
    concurrency: int = option(2, "tasks fetched, decoded and predicted at once, across requests (each holds an image in "
                                 "memory)", valid=AT_LEAST_ONE)
    inference: InferenceOptions = group(InferenceOptions, "inference")

    def basic_auth(self, password: str | None) -> tuple[str, str] | None:
        """(user, password) every request must give, or None; a user without a password (or the reverse) is refused."""
        if bool(self.basic_auth_user) != bool(password):
            raise InputError("basic auth needs both a user (--basic-auth-user or $BASIC_AUTH_USER) and $BASIC_AUTH_PASS")
        return (self.basic_auth_user, password) if password else None
