"""``crackseg serve label-studio``: crackseg as a Label Studio ML backend, pre-annotating each task it opens."""

from __future__ import annotations

import argparse
import ipaddress
import os

from crackseg.cli.options import HelpFormatter, add_inference_options, checked, inference_options, local_path
from crackseg.core.config import AT_LEAST_ONE, FRACTION, POSITIVE, Range
from crackseg.core.errors import InputError

DEFAULT_PORT = 9090  # label-studio-ml-backend's port


def add_commands(commands) -> None:
    serve = commands.add_parser(
        "serve", help="serve a model to a labelling tool: a Label Studio ML backend",
        description=(
            "Serve a model to a labelling tool, which then shows crackseg's cracks as pre-annotations.\n\n"
            "  crackseg serve label-studio --checkpoint best.pt     (on 127.0.0.1:9090 by default)"
        ),
        formatter_class=HelpFormatter,
    )
    tools = serve.add_subparsers(dest="tool", metavar="TOOL", required=True)
    studio = tools.add_parser(
        "label-studio", help="a Label Studio ML backend: cracks drawn on each task as it opens",
        description=(
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
        formatter_class=HelpFormatter,
    )
    studio.add_argument("--checkpoint", type=local_path, required=True, help="model file: a .pt, safetensors folder, .onnx or .xml")
    studio.add_argument("--threshold", type=checked(float, FRACTION), default=None,
                        help="crack probability threshold (default: the checkpoint's best validation F1 threshold)")
    studio.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; 0.0.0.0 for Label Studio on another machine or in Docker (then set basic auth)")
    studio.add_argument("--port", type=checked(int, Range(0, 65535)), default=DEFAULT_PORT,
                        help="port to listen on; 0 picks a free one (printed)")
    studio.add_argument("--label-studio-url", default=os.environ.get("LABEL_STUDIO_URL"),
                        help="Label Studio's address, for the images it serves (default: $LABEL_STUDIO_URL)")
    studio.add_argument("--basic-auth-user", default=os.environ.get("BASIC_AUTH_USER"),
                        help="basic-auth user every request must give, with the password in $BASIC_AUTH_PASS "
                             "(default: $BASIC_AUTH_USER); enter both in Label Studio's model settings")
    studio.add_argument("--max-request-mb", type=checked(float, POSITIVE), default=16.0,
                        help="MiB: largest request body taken; larger ones get 413")
    studio.add_argument("--max-image-mb", type=checked(float, POSITIVE), default=64.0,
                        help="MiB: largest image file fetched; a larger one is an error for its task")
    studio.add_argument("--concurrency", type=checked(int, AT_LEAST_ONE), default=2,
                        help="tasks fetched, decoded and predicted at once, across requests (each holds an image in memory)")
    add_inference_options(studio, "inference")
    studio.set_defaults(handler=_cmd_serve_label_studio)


def _cmd_serve_label_studio(args: argparse.Namespace) -> int:
    from crackseg.core.errors import require

    for module in ("starlette", "uvicorn", "httpx"):
        require(module, "label-studio", "crackseg serve label-studio")
    from crackseg.integrations.server import MIB, ServerSettings, build_app, listen, model_version, serve
    from crackseg.prediction.session import PredictionSession

    password = os.environ.get("BASIC_AUTH_PASS")
    if bool(args.basic_auth_user) != bool(password):
        raise InputError("basic auth needs both a user (--basic-auth-user or $BASIC_AUTH_USER) and $BASIC_AUTH_PASS")
    settings = ServerSettings(
        label_studio_url=args.label_studio_url or None, api_key=os.environ.get("LABEL_STUDIO_API_KEY") or None,
        basic_auth=(args.basic_auth_user, password) if password else None, max_request_bytes=int(args.max_request_mb * MIB),
        max_image_bytes=int(args.max_image_mb * MIB), concurrency=args.concurrency)
    listener = listen(args.host, args.port)  # a port in use fails before the model loads
    session = PredictionSession(args.checkpoint, inference_options(args), args.threshold)
    app = build_app(session, settings, model_version(args.checkpoint))
    print(_connect_line(listener, settings.basic_auth is not None, session.threshold), flush=True)
    serve(app, listener)
    return 0


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
