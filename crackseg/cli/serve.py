"""``crackseg serve label-studio``: crackseg as a Label Studio ML backend, pre-annotating each task it opens."""

from __future__ import annotations

import ipaddress
import os

from crackseg.cli.options import add_command
from crackseg.integrations.options import ServeOptions


def add_commands(commands) -> None:
    serve = add_command(
        commands, "serve", "serve a model to a labelling tool: a Label Studio ML backend",
        (
            "Serve a model to a labelling tool, which then shows crackseg's cracks as pre-annotations.\n\n"
            "  crackseg serve label-studio --checkpoint best.pt     (on 127.0.0.1:9090 by default)"
        ),
    )
    tools = serve.add_subparsers(dest="tool", metavar="TOOL", required=True)
    add_command(
        tools, "label-studio", "a Label Studio ML backend: cracks drawn on each task as it opens",
        (
            "Serve CHECKPOINT as a Label Studio ML backend (/health, /setup, /predict, /webhook). In\n"
            "Label Studio: Project > Settings > Model > Connect Model, Backend URL http://HOST:PORT (the\n"
            "URL this command prints; from Label Studio in Docker on this machine:\n"
            "http://host.docker.internal:PORT with --host 0.0.0.0), with basic auth when started with it;\n"
            "turn on 'Interactive preannotations' or 'Use predictions to prelabel tasks'.\n\n"
            "Each task gets predict's mask of its image as the labelling config asks: a brush\n"
            "(<BrushLabels>) or a polygon per crack (<PolygonLabels>), on the config's crack label.\n"
            "Images Label Studio serves (/data/upload/..., /data/local-files/?d=...) are fetched from\n"
            "LABEL_STUDIO_URL with LABEL_STUDIO_API_KEY (Account & Settings > Access Token: a legacy token\n"
            "or a personal access token), other http(s) URLs without it.\n\n"
            "  LABEL_STUDIO_URL=http://localhost:8080 LABEL_STUDIO_API_KEY=... \\\n"
            "      crackseg serve label-studio --checkpoint best.pt --port 9090\n\n"
            "Environment: LABEL_STUDIO_URL, LABEL_STUDIO_API_KEY, BASIC_AUTH_USER and BASIC_AUTH_PASS\n"
            "(as label-studio-ml-backend reads them). Needs pip install 'crackseg[label-studio]'."
        ),
        ServeOptions, _cmd_serve_label_studio,
    )


def _cmd_serve_label_studio(options: ServeOptions) -> int:
    from crackseg.core.errors import require

    for module in ("starlette", "uvicorn", "httpx"):
        require(module, "label-studio", "crackseg serve label-studio")
    from crackseg.integrations.server import MIB, ServerSettings, build_app, listen, model_version, serve
    from crackseg.prediction.session import PredictionSession

    settings = ServerSettings(
        label_studio_url=options.label_studio_url or None, api_key=os.environ.get("LABEL_STUDIO_API_KEY") or None,
        basic_auth=options.basic_auth(os.environ.get("BASIC_AUTH_PASS")), max_request_bytes=int(options.max_request_mb * MIB),
        max_image_bytes=int(options.max_image_mb * MIB), concurrency=options.concurrency, allowed_hosts=options.allow_host)
    listener = listen(options.host, options.port)  # a port in use fails before the model loads
    session = PredictionSession(options.checkpoint, options.inference, options.threshold)
    app = build_app(session, settings, model_version(options.checkpoint, _mask_settings(options.inference, session.threshold)))
    print(_connect_line(listener, settings.basic_auth is not None, session.threshold), flush=True)
    serve(app, listener, settings.header_timeout_s)
    return 0


def _mask_settings(inference, threshold: float) -> str:
    """The settings besides the model that change its masks: the threshold, and the inference flags not at their default."""
    default = type(inference)()
    changed = [f"{name} {getattr(inference, name)}" for name in ("tile", "overlap", "tta") if getattr(inference, name) != getattr(default, name)]
    if inference.resize is not None:
        changed.append("resize {}x{}".format(*inference.resize))
    return ", ".join([f"threshold {threshold:g}", *changed])


def _connect_line(listener, basic_auth: bool, threshold: float) -> str:
    """What to enter in Label Studio, with the port actually bound (--port 0 picks one)."""
    host, port = listener.getsockname()[:2]
    address = ipaddress.ip_address(host)
    url = f"http://{f'[{host}]' if address.version == 6 else host}:{port}"
    line = (f"crackseg: Label Studio ML backend on {url} (threshold {threshold:g}); in Label Studio: Project > Settings > "
            f"Model > Connect Model, Backend URL {url}")
    if address.is_unspecified:
        line += " with this machine's address in place of " + host
    if not (basic_auth or address.is_loopback):
        line += "; warning: reachable from other machines without basic auth (set BASIC_AUTH_USER and BASIC_AUTH_PASS)"
    return line
