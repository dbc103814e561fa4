"""The Label Studio ML backend over real HTTP on loopback: ``crackseg serve label-studio`` in its own process, a fake
Label Studio serving uploads behind its token, and requests shaped as Label Studio sends them. The brush comes back
through Label Studio's own decoder as predict's mask."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_result, pavement, served
from PIL import Image

from crackseg.integrations.label_studio import read_config
from crackseg.prediction.session import PredictionSession

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
from label_studio_sdk.converter.brush import decode_rle  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

KEY = "legacy-token-0123456789"
JWT = ".".join(base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")
               for part in ({"alg": "HS256", "typ": "JWT"}, {"token_type": "refresh", "user_id": 1}, "signature"))
AUTH = ("annotator", "s3cret")
BRUSH = """<View><Image name="image" value="$image" zoom="true"/>
  <BrushLabels name="tag" toName="image"><Label value="crack" background="#FF0000"/></BrushLabels></View>"""
POLYGON = """<View><Image name="img" value="$photo"/>
  <PolygonLabels name="outline" toName="img"><Label value="Crack"/><Label value="joint"/></PolygonLabels></View>"""
START_S = 60  # for the server's imports and model load on a busy machine


class FakeLabelStudio:
    """Serves /data/upload/1/<name> to ``Token KEY`` or the latest access token ``/api/token/refresh/`` issued for JWT."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.seen, self.issued, self.valid, self.slow = files, [], 0, None, 0
        app = Starlette(routes=[Route("/data/upload/1/slow.png", self.slow_upload), Route("/data/upload/1/{name}", self.upload),
                                Route("/api/token/refresh/", self.refresh, methods=["POST"])])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.listener]}, daemon=True)

    async def upload(self, request):
        header = request.headers.get("authorization")
        self.seen.append(header)
        if header not in (f"Token {KEY}", f"Bearer {self.valid}"):
            return JSONResponse({"detail": "Authentication credentials were not provided."}, 401)
        name = request.path_params["name"]
        return Response(self.files[name], media_type="image/png") if name in self.files else JSONResponse({"detail": "Not found."}, 404)

    async def slow_upload(self, request):
        """The photo, after 2 s: a task a client may give up waiting for."""
        import anyio

        self.slow += 1
        await anyio.sleep(2)
        return Response(self.files["wall.png"], media_type="image/png")

    async def refresh(self, request):
        if (await request.json()).get("refresh") != JWT:
            return JSONResponse({"detail": "Token is invalid"}, 401)
        self.issued += 1
        self.valid = f"access-{self.issued}"
        return JSONResponse({"access": self.valid})


@pytest.fixture(scope="module")
def photo(checkpoint, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ls")
    path = folder / "wall.png"
    Image.fromarray(pavement(80, 128, seed=4).transpose(1, 2, 0)).save(path)
    threshold = float(np.median(PredictionSession(checkpoint).probabilities(Image.open(path))))  # about half is crack
    mask = PredictionSession(checkpoint, threshold=threshold).mask(Image.open(path))
    return {"checkpoint": checkpoint, "path": path, "threshold": threshold, "mask": mask, "folder": folder}


@pytest.fixture(scope="module")
def studio(photo):
    wall, noise = photo["path"].read_bytes(), io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (200, 200, 3), dtype=np.uint8)).save(noise, "PNG")
    garbled = bytearray(noise.getvalue())  # its second IDAT chunk's type garbled: Pillow's SyntaxError, not an OSError
    second = garbled.find(b"IDAT", garbled.find(b"IDAT") + 4)
    garbled[second : second + 4] = b"\x00\x01\x02\x03"
    fake = FakeLabelStudio({"wall.png": wall, "broken.png": b"\x89PNG\r\n\x1a\n not really", "garbled.png": bytes(garbled)})
    fake.thread.start()
    while not fake.server.started:
        time.sleep(0.02)
    yield fake
    fake.server.should_exit = True
    fake.thread.join(10)


@pytest.fixture(scope="module")
def internal(photo):
    """host:port of a plain http server on loopback serving the photo's folder: an address task images may not come
    from unless the operator allows its host."""
    with served(photo["folder"]) as url:
        yield url.removeprefix("http://").rstrip("/")


@pytest.fixture(scope="module")
def backends(photo, studio, internal):
    """Two servers, started together: one with the legacy token, basic auth, a 20 KiB request limit and the internal
    server's host:port allowed; one with a personal access token (JWT), no auth and no host allowed."""
    base = {name: value for name, value in os.environ.items() if not name.startswith(("BASIC_AUTH_", "LABEL_STUDIO_"))}
    base["LABEL_STUDIO_URL"] = studio.url
    flags = ["--checkpoint", photo["checkpoint"], "--threshold", repr(photo["threshold"]), "--port", "0", "--device", "cpu"]
    started = [_start(photo["folder"] / "token.log", base | {"LABEL_STUDIO_API_KEY": KEY, "BASIC_AUTH_USER": AUTH[0],
                                                             "BASIC_AUTH_PASS": AUTH[1]}, flags + ["--max-request-mb", "0.02", "--allow-host", internal]),
               _start(photo["folder"] / "jwt.log", base | {"LABEL_STUDIO_API_KEY": JWT}, flags)]
    urls = [_url_when_up(process, log) for process, log in started]
    yield {"token": httpx.Client(base_url=urls[0], auth=AUTH, timeout=30), "jwt": httpx.Client(base_url=urls[1], timeout=30)}
    for process, _ in started:
        process.terminate()
        process.wait(10)


def _start(log: Path, env: dict, flags: list) -> tuple[subprocess.Popen, Path]:
    command = [sys.executable, "-m", "crackseg", "serve", "label-studio", *map(str, flags)]
    with open(log, "w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT), log


def _url_when_up(process: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and process.poll() is None:
        for line in log.read_text().splitlines():
            if "Backend URL " in line:
                return line.split("Backend URL ")[1].split()[0]
        time.sleep(0.1)
    raise AssertionError(f"the server did not start: {log.read_text()}")


def _predict(client, tasks: list, config: str = BRUSH) -> httpx.Response:
    """A /predict request as Label Studio sends it (ml/api_connector.py: tasks, project, label_config, params)."""
    return client.post("/predict", json={"tasks": tasks, "model_version": None, "project": "1.1700000000",
                                         "label_config": config, "params": {"login": None, "password": None, "context": None}})


def _task(task_id: int, url: str, key: str = "image") -> dict:
    return {"id": task_id, "data": {key: url}, "meta": {}, "created_at": "2024-05-01T10:00:00.000000Z", "annotations": [],
            "predictions": [], "is_labeled": False, "overlap": 1, "inner_id": task_id, "total_annotations": 0,
            "cancelled_annotations": 0, "total_predictions": 0, "project": 1, "updated_by": None, "file_upload": 1}


def test_health_setup_metrics_and_webhook(backends):
    client = backends["token"]
    health = client.get("/health").json()
    assert health["status"] == "UP" and health["model_class"] == "crackseg" and "model.pt@" in health["model_version"]
    assert client.get("/").json() == health and client.get("/metrics").json() == {}
    setup = client.post("/setup", json={"project": "1.1700000000", "schema": BRUSH, "hostname": "http://localhost:8080",
                                        "access_token": "x", "model_version": None, "extra_params": None})
    assert setup.status_code == 200 and setup.json() == {"model_version": health["model_version"]}
    refused = client.post("/setup", json={"project": "1.1", "schema": "<View><Image name='i' value='$i'/></View>"})
    assert refused.status_code == 422 and "no <BrushLabels> or <PolygonLabels>" in refused.json()["error"]
    hook = client.post("/webhook", json={"action": "START_TRAINING", "project": {"id": 1, "label_config": BRUSH}})
    assert hook.status_code == 200 and "crackseg train" in hook.json()["detail"]


def test_the_brush_decoded_by_label_studio_is_predicts_mask(backends, photo, studio):
    answer = _predict(backends["token"], [_task(7, "/data/upload/1/wall.png")])
    assert answer.status_code == 200, answer.text
    (entry,) = answer.json()["results"]
    (result,) = entry["result"]
    names = (result["type"], result["from_name"], result["to_name"], result["value"]["brushlabels"])
    assert names == ("brushlabels", "tag", "image", ["crack"])
    height, width = photo["mask"].shape
    assert (result["original_height"], result["original_width"]) == (height, width)
    brush = decode_rle(result["value"]["rle"]).reshape(height, width, 4)[..., 3] > 0
    assert 0.2 < photo["mask"].mean() < 0.8 and np.array_equal(brush, photo["mask"])
    assert 0.0 <= entry["score"] <= 1.0 and entry["model_version"].startswith("crackseg ")
    assert f"Token {KEY}" in studio.seen


def test_polygons_with_a_personal_access_token_exchanged_and_renewed(backends, photo, studio):
    expected = json.loads(json.dumps(read_config(POLYGON).results(photo["mask"])))
    first = _predict(backends["jwt"], [_task(3, f"{studio.url}/data/upload/1/wall.png", "photo")], POLYGON)
    assert first.status_code == 200, first.text
    results = first.json()["results"][0]["result"]
    assert results == expected and len(results) > 1
    names = {(r["type"], r["from_name"], r["to_name"], *r["value"]["polygonlabels"]) for r in results}
    assert names == {("polygonlabels", "outline", "img", "Crack")}
    assert all(0 <= x <= 100 and 0 <= y <= 100 for r in results for x, y in r["value"]["points"])
    assert studio.issued == 1 and studio.seen[-1] == "Bearer access-1"
    studio.valid = "expired"  # the access token expires: one 401, one exchange, then the image
    again = _predict(backends["jwt"], [_task(3, "/data/upload/1/wall.png", "photo")], POLYGON)
    assert again.status_code == 200 and again.json()["results"][0]["result"] == expected
    assert studio.issued == 2 and studio.seen[-2:] == ["Bearer access-1", "Bearer access-2"]


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return listener.getsockname()[1]


@pytest.mark.parametrize("send, status, reason", [
    (lambda c: c.post("/predict", content=b"{not json", headers={"content-type": "application/json"}), 400, "not JSON"),
    (lambda c: c.post("/predict", json=[1, 2]), 400, "must be a JSON object"),
    # UTF-16, whose byte pairs (U+2241 holds a quote's byte) hid the nesting from the count: JSON only as UTF-8
    (lambda c: c.post("/predict", content=('{"a": "\u2241", "b": ' + "[" * 2000 + "]" * 2000 + "}").encode("utf-16-le")),
     400, "the request body is not JSON"),
    (lambda c: c.post("/predict", content='{"tasks": "é"}'.encode("latin-1")), 400, "not UTF-8 JSON (invalid continuation byte"),
    # a lone surrogate is no character: it reached the XML parser and the JSON answer as a 500
    (lambda c: c.post("/setup", content=rb'{"schema": "<View>\ud800</View>"}'), 400, "escapes a lone UTF-16 surrogate ('\\ud800')"),
    (lambda c: c.post("/webhook", content=rb'{"action": "\udc00"}'), 400, "escapes a lone UTF-16 surrogate ('\\udc00')"),
    (lambda c: c.post("/predict", json={"tasks": [], "label_config": BRUSH}), 400, "no tasks"),
    (lambda c: c.post("/predict", content=b"\xef\xbb\xbf" + json.dumps({"tasks": []}).encode()), 400, "no tasks"),  # a BOM is read
    (lambda c: c.post("/predict", json={"label_config": BRUSH}), 400, "no tasks"),
    (lambda c: _predict(c, [_task(1, "/data/upload/1/wall.png")], "<View/>"), 422, "no <BrushLabels>"),
    (lambda c: c.post("/predict", content=b" " * 30_000), 413, "over 20971 bytes"),
    (lambda c: c.post("/predict", content=iter([b" " * 8000] * 4)), 413, "over 20971 bytes"),  # chunked, no length
    (lambda c: _predict(c, [_task(9, f"http://127.0.0.1:{_closed_port()}/p.png")]), 403, "is at a non-public address (127.0.0.1)"),
    (lambda c: _predict(c, [_task(4, "/data/upload/1/gone.png")]), 404, "task 4: http://127.0.0.1:"),
    (lambda c: _predict(c, [_task(5, "/data/upload/1/broken.png")]), 422, "broken.png: not a readable image"),
    (lambda c: _predict(c, [_task(6, "ftp://x/p.png")]), 422, "task 6: cannot fetch 'ftp://x/p.png'"),
    (lambda c: c.get("/predict"), 405, "Method Not Allowed"),
    (lambda c: c.get("/nowhere"), 404, "Not Found"),
    (lambda c: httpx.get(c.base_url.join("/health")), 401, "unauthorized"),
    (lambda c: httpx.get(c.base_url.join("/health"), auth=(AUTH[0], "wrong")), 401, "unauthorized"),
])
def test_bad_requests_get_one_line_and_the_server_keeps_serving(backends, send, status, reason):
    client = backends["token"]
    answer = send(client)
    error = answer.json()["error"]
    assert answer.status_code == status and reason in error and "\n" not in error and KEY not in error, (answer.status_code, error)
    if status == 401:
        assert answer.headers["www-authenticate"].startswith("Basic")
    assert client.get("/health").json()["status"] == "UP"


def test_a_failed_task_beside_good_ones_gets_an_error_entry(backends, photo):
    tasks = [_task(1, "/data/upload/1/wall.png"), _task(2, "/data/upload/1/broken.png"), _task(3, "/data/upload/1/garbled.png"),
             _task(4, "http://[::1/x.png"), _task(5, "http://127.0.0.1:99999/x.png")]
    answer = _predict(backends["token"], tasks)
    assert answer.status_code == 200, answer.text
    good, bad, garbled, *unparsed = answer.json()["results"]
    assert [entry["error"].split(":")[0] for entry in unparsed] == ["task 4", "task 5"] and not any("result" in e for e in unparsed)
    assert good["result"] and "error" not in good
    # no result: Label Studio passes such an entry over, where an empty one would be stored as "no cracks"
    assert "result" not in bad and bad["error"].startswith("task 2: ")
    assert "result" not in garbled and garbled["error"].startswith("task 3: ") and "cannot decode" in garbled["error"]


def test_the_model_version_names_the_threshold_and_the_inference_flags_that_change_masks(photo):
    from crackseg.cli.serve import _mask_settings
    from crackseg.integrations.server import model_version
    from crackseg.model.options import InferenceOptions

    plain = model_version(photo["checkpoint"], _mask_settings(InferenceOptions(), 0.5))
    assert plain.endswith("@" + plain.split("@")[1]) and plain.endswith(" threshold 0.5")
    versions = {plain, model_version(photo["checkpoint"], _mask_settings(InferenceOptions(), 0.3)),
                model_version(photo["checkpoint"], _mask_settings(InferenceOptions(tta="flip"), 0.5)),
                model_version(photo["checkpoint"], _mask_settings(InferenceOptions(tile=256, overlap=32), 0.5)),
                model_version(photo["checkpoint"], _mask_settings(InferenceOptions(resize=(64, 64)), 0.5))}
    assert len(versions) == 5
    assert model_version(photo["checkpoint"], _mask_settings(InferenceOptions(batch_size=4, device="cpu"), 0.5)) == plain


def test_allow_host_lets_tasks_fetch_from_an_internal_host_and_only_there(backends, internal):
    task = _task(1, f"http://{internal}/wall.png")
    allowed = _predict(backends["token"], [task]).json()["results"][0]
    assert allowed["result"] and "error" not in allowed
    refused = _predict(backends["jwt"], [task])  # its only task refused: the request is
    assert refused.status_code == 403 and "is at a non-public address" in refused.json()["error"]
    assert "--allow-host" in refused.json()["error"]


def test_a_bad_checkpoint_or_half_an_auth_stops_before_serving(tmp_path, monkeypatch):
    code, err = cli_result(["serve", "label-studio", "--checkpoint", tmp_path / "missing.pt", "--port", "0"])
    assert code == 2 and err.count("\n") == 1 and "missing.pt" in err, err
    monkeypatch.delenv("BASIC_AUTH_PASS", raising=False)
    code, err = cli_result(["serve", "label-studio", "--checkpoint", tmp_path / "missing.pt", "--basic-auth-user", "me"])
    assert code == 2 and "BASIC_AUTH_PASS" in err and err.count("\n") == 1, err
    for url in ("localhost:8080", "http://localhost:808O", "http://[::1", "http://localhost:99999", "http://:8080"):
        monkeypatch.setenv("LABEL_STUDIO_URL", url)
        code, err = cli_result(["serve", "label-studio", "--checkpoint", tmp_path / "missing.pt"])
        assert code == 2 and "LABEL_STUDIO_URL must be" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["http://files.internal:8000", "files.internal:8000/", "files.internal:http", "[::1"])
def test_an_allow_host_that_could_never_match_stops_before_serving(tmp_path, value):
    (tmp_path / "model.pt").write_bytes(b"never loaded: options come first")
    code, err = cli_result(["serve", "label-studio", "--checkpoint", tmp_path / "model.pt", "--allow-host", value])
    assert code == 2 and err.count("\n") == 1 and "--allow-host" in err and f"{value!r}: give a host or host:port" in err, err


def test_allowed_hosts_match_as_written_in_any_case_and_ipv6_in_brackets():
    from crackseg.integrations.fetching import ImageFetcher
    from crackseg.integrations.options import allowed_host

    fetcher = ImageFetcher(None, None, tuple(map(allowed_host, ["Files.Internal", "[::1]:8000", "10.0.0.5:81", "fe80::1"])), 1, 1.0)
    trusted = ["http://files.internal/a.png", "http://FILES.internal:9/a.png", "http://[::1]:8000/a.png", "http://10.0.0.5:81/a.png",
               "http://[fe80::1]/a.png"]
    assert all(map(fetcher.trusted, trusted))
    assert not any(map(fetcher.trusted, ["http://[::1]:8001/a.png", "http://10.0.0.5/a.png", "http://[::1:8000]/a.png"]))


def test_an_image_that_trickles_in_is_cut_off_at_the_fetch_timeout(tmp_path):
    from crackseg.integrations.fetching import ImageFetcher

    async def trickle(request):
        async def body():
            for _ in range(40):
                yield b"x" * 10
                await anyio.sleep(0.1)
        return StreamingResponse(body(), media_type="image/png")

    import anyio
    from starlette.responses import StreamingResponse

    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/slow.png", trickle)]), log_level="warning"))
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        host = f"127.0.0.1:{listener.getsockname()[1]}"
        fetcher = ImageFetcher(None, None, (host,), 1 << 20, 1.0)  # each read arrives within the timeout, the whole does not
        started = time.monotonic()
        with pytest.raises(Exception) as refused:
            fetcher.fetch(f"http://{host}/slow.png", "task 1")
        assert refused.value.status_code == 504 and "within 1 s" in refused.value.detail
        assert time.monotonic() - started < 3
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_port_in_use_or_a_host_that_is_not_here_is_one_line(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"never loaded: listening comes first")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, err = cli_result(["serve", "label-studio", "--checkpoint", tmp_path / "model.pt", "--host", "127.0.0.1",
                                "--port", port])
    assert code == 2 and err.count("\n") == 1 and f"--host 127.0.0.1 --port {port}: cannot listen there (" in err, err
    code, err = cli_result(["serve", "label-studio", "--checkpoint", tmp_path / "model.pt", "--host", "no-such-host.invalid"])
    assert code == 2 and err.count("\n") == 1 and "--host no-such-host.invalid: not an address of this machine" in err, err
    from crackseg.integrations.server import listen

    with listen("", 0) as every:  # an empty host is every interface, as bind takes it
        assert every.getsockname()[0] == "0.0.0.0"


def test_a_client_that_goes_away_is_let_go_quietly_and_its_waiting_tasks_are_not_predicted(backends, photo, studio):
    client, log = backends["jwt"], photo["folder"] / "jwt.log"
    with socket.create_connection((client.base_url.host, client.base_url.port)) as half:
        half.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tasks\":")
    slow = [_task(number, "/data/upload/1/slow.png") for number in range(5)]
    with pytest.raises(httpx.ReadTimeout):  # gone while the first task's image is on its way
        client.post("/predict", json={"tasks": slow, "label_config": BRUSH}, timeout=0.5)
    time.sleep(5)  # the five would have taken 10 s
    assert studio.slow == 1
    assert client.get("/health").json()["status"] == "UP"
    assert "Exception in ASGI application" not in log.read_text()


def test_no_secret_reaches_the_logs(backends, photo):
    _predict(backends["token"], [_task(8, "/data/upload/1/wall.png")])
    logs = (photo["folder"] / "token.log").read_text() + (photo["folder"] / "jwt.log").read_text()
    assert "POST /predict" in logs and not any(secret in logs for secret in (KEY, JWT, AUTH[1], "access-1"))


def test_a_bug_is_a_500_with_one_line_and_the_server_goes_on(studio):
    from starlette.testclient import TestClient

    from crackseg.integrations.server import ServerSettings, build_app

    class OutOfMemory:
        threshold = 0.5

        def probabilities(self, pixels):
            raise RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")

    app = build_app(OutOfMemory(), ServerSettings(label_studio_url=studio.url, api_key=KEY), "crackseg test")
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = _predict(client, [_task(1, "/data/upload/1/wall.png")])
        assert answer.status_code == 500 and answer.json() == {"error": "crackseg failed: RuntimeError: CUDA out of memory."}
        assert client.get("/health").json()["status"] == "UP"


@pytest.mark.parametrize("limit, status", [(6000, 200), (4000, 422)])
def test_serve_refuses_images_where_predict_does_at_twice_pillows_pixel_limit(photo, studio, monkeypatch, limit, status):
    from starlette.testclient import TestClient

    from crackseg.integrations.server import ServerSettings, build_app

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)  # the 80x128 photo: over the limit, under twice it, or over both
    session = PredictionSession(photo["checkpoint"], threshold=photo["threshold"])
    app = build_app(session, ServerSettings(label_studio_url=studio.url, api_key=KEY), "crackseg test")
    with TestClient(app, raise_server_exceptions=False) as client, pytest.warns(Image.DecompressionBombWarning) if status == 200 else contextlib.nullcontext():
        answer = _predict(client, [_task(1, "/data/upload/1/wall.png")])
    assert answer.status_code == status, answer.text
