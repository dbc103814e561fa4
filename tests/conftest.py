"""Shared fixtures and helpers: tiny synthetic datasets, models and GeoTIFFs built in tmp_path, predict run
in this process, an S3 server and an HTTP server on loopback, the real CFD data when present."""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib
import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # before torch is imported: it sizes its thread pool once
    # pytest -n N: each worker gets its share of the cores (tiny tensors gain little from threads and lose to oversubscription)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

from services import moto_server

from crackseg.data.synth import write_dataset

CFD_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "cfd"


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory) -> Path:
    """Twelve 64 px synthetic images with masks: read-only, shared by the session."""
    root = tmp_path_factory.mktemp("synth")
    write_dataset(root, count=12, size=(64, 64), seed=7)
    return root


@pytest.fixture
def cfd_root() -> Path:
    if not (CFD_ROOT / "images").is_dir():
        pytest.skip("../shared/datasets/cfd is not present")
    return CFD_ROOT


_ISOLATED: list = []  # the one spawned worker, started by the first isolated test


def isolated(test):
    """Run a test in another interpreter (spawned, so nothing of this process is inherited).

    For tests that run ONNX Runtime: after it ran in the test process, that process died of a
    segmentation fault in later, unrelated tests (always after the same mix of earlier tests,
    never in a short run or in a command-line run, which is one process per command). The
    test's fixture values must pickle; assertion errors come back as they are. One worker
    serves every isolated test (its imports are paid once); a worker that dies fails the test
    (BrokenProcessPool) rather than hanging it. A helper so wrapped returns what it returns.
    """

    @functools.wraps(test)
    def run(*args, **kwargs):
        if not _ISOLATED or _ISOLATED[0]._broken:
            _ISOLATED[:] = [ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))]
        skipped, value = _ISOLATED[0].submit(_call_unwrapped, test.__module__, test.__name__, args, kwargs).result()
        if skipped is not None:
            pytest.skip(skipped)
        return value

    return run


def _call_unwrapped(module: str, name: str, args, kwargs) -> tuple[str | None, object]:
    """Runs the test: (the reason of its skip, None) or (None, what it returned); pytest's Skipped does not pickle."""
    try:
        return None, getattr(importlib.import_module(module), name).__wrapped__(*args, **kwargs)
    except pytest.skip.Exception as skip:
        return skip.msg, None


def dark_pixel_model(folder: Path) -> Path:
    """An OpenVINO model file that calls dark pixels cracks (a 1x1 convolution, threshold 0.5), so
    every mask is known in advance. A model of no registered architecture has no checkpoint form,
    and OpenVINO runs it because ONNX Runtime cannot run in the test process (see isolated)."""
    pytest.importorskip("openvino")
    import torch
    from torch import nn

    from crackseg.model.export import write_exported
    from crackseg.model.networks import CrackSegModel

    net = nn.Conv2d(3, 1, 1)
    with torch.no_grad():
        net.weight.fill_(-1.0)
        net.bias.zero_()
    model = CrackSegModel(net, "unet", "dark-pixels", size_divisor=1)
    model.threshold = 0.5
    return write_exported(model, "openvino", Path(folder) / "dark.xml")


@pytest.fixture(scope="session")
def dark_checkpoint(tmp_path_factory) -> Path:
    """dark_pixel_model's file, made once: tests only read it."""
    return dark_pixel_model(tmp_path_factory.mktemp("dark"))


@pytest.fixture(scope="module")
def model():
    """A UNet with a mobilenet_v2 encoder, random weights (seed 0), in eval mode; one per test module."""
    import torch

    from crackseg.model.networks import build_model

    torch.manual_seed(0)
    return build_model("mobilenet_v2").eval()


@pytest.fixture(scope="module")
def checkpoint(model, tmp_path_factory) -> Path:
    """``model`` saved as a crackseg checkpoint (threshold 0.5), for tests that predict from a file; one per test module."""
    from crackseg.model.checkpoint import save_model

    path = tmp_path_factory.mktemp("model") / "model.pt"
    model.threshold = 0.5
    save_model(model, path)
    return path


@pytest.fixture
def photos(synth_root, tmp_path) -> Path:
    """in/a.jpg, in/b.jpg, in/sub/c.jpg: 64 px synthetic crack photos in a folder with a subfolder."""
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    for source, target in zip(sorted((synth_root / "images").glob("*.jpg")), ("a.jpg", "b.jpg", "sub/c.jpg")):
        shutil.copyfile(source, folder / target)
    return folder


def predict_cli(*args) -> int:
    """The exit status of ``crackseg predict ARGS`` run in this process on the CPU, without loader processes."""
    from crackseg.cli.main import main

    try:
        return main(["predict", *map(str, args), "--device", "cpu", "--workers", "0"])
    except SystemExit as exit:  # argparse's usage errors
        return exit.code


def predict_tiled(*args) -> int:
    """predict_cli with 256 px tiles overlapping by 32, so that rasters of a few hundred px span several tiles."""
    return predict_cli(*args, "--tile", "256", "--overlap", "32")


def csv_rows(path: Path) -> list[dict]:
    with open(path) as file:
        return list(csv.DictReader(file))


def save_maps(folder: Path, arrays: dict[str, np.ndarray], bits: int = 8) -> None:
    """Maps in [0, 1] as ``folder/<stem>.png``, 8- or 16-bit grey without predict's probability mark, as other tools
    write masks and probability maps."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    top, dtype = (65535, np.uint16) if bits == 16 else (255, np.uint8)
    for stem, array in arrays.items():
        Image.fromarray((array * top).round().astype(dtype)).save(folder / f"{stem}.png")


def predict_photos_named(names: list[str], folder: Path, checkpoint: Path, out: Path, monkeypatch) -> None:
    """A light 60x40 photo with one dark line under each of ``names`` in ``folder``, predicted as ``predict .`` from
    there, so that each name starts its row's path in predictions.csv."""
    from PIL import Image

    folder.mkdir()
    for name in names:
        photo = np.full((40, 60, 3), 200, np.uint8)
        photo[20:23, 5:55] = 20
        Image.fromarray(photo).save(folder / name)
    monkeypatch.chdir(folder)
    assert predict_cli("--checkpoint", checkpoint, ".", "--out", out) == 0


# GeoTIFFs. rasterio is imported only when these run: the modules that call them skip without it (pytest.importorskip).


def utm_transform(px_m: float = 0.002):
    """The geotransform of north-up pixels ``px_m`` metres wide from (500000, 5000000) in UTM 33N (EPSG:32633)."""
    from affine import Affine

    return Affine(px_m, 0.0, 500000.0, 0.0, -px_m, 5000000.0)


def write_geotiff(path, bands: np.ndarray, crs="EPSG:32633", transform=None, **extra) -> None:
    """``bands`` (count, H, W) as a tiled GeoTIFF with 512 px blocks, as survey software writes them;
    2 mm pixels in UTM 33N unless ``crs`` and ``transform`` say otherwise."""
    import rasterio

    count, height, width = bands.shape
    transform = utm_transform() if transform is None else transform
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=count, dtype=bands.dtype,
                       crs=crs, transform=transform, tiled=True, blockxsize=512, blockysize=512, compress="deflate", **extra) as out:
        out.write(bands)


def pavement(height: int, width: int, seed: int = 0) -> np.ndarray:
    """(3, H, W) uint8 grey texture with dark lines: across the middle, and one slanting over many rows."""
    rng = np.random.default_rng(seed)
    image = rng.integers(150, 230, (height, width), dtype=np.uint8)
    image[height // 2 : height // 2 + 3, 50 : width - 50] = 30
    for col in range(100, min(width, 1300)):
        row = 40 + (col - 100) * (height - 80) // 1200
        image[row : row + 2, col] = 25
    return np.repeat(image[None], 3, axis=0)


def read_mask(path) -> tuple[np.ndarray, np.ndarray, dict]:
    """A one-band raster output: (its values, its dataset mask, {crs, transform, tiled})."""
    import rasterio

    with rasterio.open(path) as raster:
        return raster.read(1), raster.dataset_mask(), {"crs": raster.crs, "transform": raster.transform, "tiled": raster.profile.get("tiled")}


def browser():
    """A headless Chromium driven through the system's chromedriver (nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1400"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


BROWSER_WAIT_S = 20.0  # a page renders, sorts and loads its pictures after what asked for it: later still on a busy machine


def assert_soon(driver, read, expected, timeout: float = BROWSER_WAIT_S):
    """Assert that ``read()`` comes to equal ``expected`` within ``timeout`` s, polled by selenium's explicit wait:
    never on what the page shows the moment after a load or a click. Returns the value."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    transient = (NoSuchElementException, StaleElementReferenceException)  # the page is replacing what was read
    try:
        WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=transient).until(lambda _: read() == expected)
    except TimeoutException:
        pass  # the assertion below shows what the page shows instead
    value = read()
    assert value == expected, f"after {timeout:g} s the page shows {value!r}, not {expected!r}"
    return value


def loaded_pictures(driver, css: str, timeout: float = BROWSER_WAIT_S) -> list[int]:
    """The natural widths of the pictures ``css`` selects, once every one has loaded (each scrolled into view: they
    load lazily); 0 for a picture that failed to load, as the browser reports it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    pictures = driver.find_elements(By.CSS_SELECTOR, css)
    for picture in pictures:
        driver.execute_script("arguments[0].scrollIntoView()", picture)
        WebDriverWait(driver, timeout, poll_frequency=0.1).until(
            lambda _: driver.execute_script("return arguments[0].complete", picture), f"{css}: a picture never loaded")
    return [driver.execute_script("return arguments[0].naturalWidth", picture) for picture in pictures]


needs_browser = pytest.mark.skipif(
    not (shutil.which("chromedriver") and (shutil.which("chromium") or shutil.which("chromium-browser"))),
    reason="no chromium and chromedriver installed",
)


def as_format_1(payload: dict) -> None:
    """A checkpoint's payload as format 1 (crackseg before the settings were covered) stored it: its checksum over the
    weights only."""
    import hashlib

    import torch

    state, digest = payload["model"]["state_dict"], hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    payload["version"], payload["model"]["sha256"] = 1, digest.hexdigest()


def cli_result(argv: list[str]) -> tuple[int, str]:
    """``crackseg ARGV`` in this process: its exit status and what it wrote on stderr."""
    import contextlib
    import io

    from crackseg.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(arg) for arg in argv])
        except SystemExit as exit:
            code = exit.code
    return code, err.getvalue()


def read_only_mount(monkeypatch, folder: Path) -> None:
    """Temporary files in ``folder`` fail as on a read-only mount: the only way root is refused a write."""
    temporary_file = tempfile.TemporaryFile

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == folder:
            raise OSError(30, "Read-only file system")
        return temporary_file(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


# Object storage: an S3 server (moto's) on loopback, in a subprocess (in this process it stalls GDAL writes).

S3_KEY_ID = "AKIACRACKSEGTEST0001"
S3_SECRET = "crackseg-test-secret-7f3a9c"


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of ``python -m moto.server`` on a free port of 127.0.0.1, stopped at the end of the session."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with moto_server() as endpoint:
        yield endpoint


class S3Bucket:
    """A fresh bucket on the test S3 server, with the environment pointing at it (see the ``s3`` fixture)."""

    def __init__(self, endpoint: str, name: str):
        import boto3

        self.endpoint, self.name = endpoint, name
        self.client = boto3.client("s3")
        self.client.create_bucket(Bucket=name)

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"

    def put(self, key: str, data: bytes) -> str:
        """Upload ``data`` as ``key``; returns its s3:// URL."""
        self.client.put_object(Bucket=self.name, Key=key, Body=data)
        return self.url(key)

    def upload(self, folder: Path, prefix: str) -> str:
        """Every file under ``folder`` as ``prefix/<its path below folder>``; returns the prefix's URL (ending in /)."""
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            self.put(f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes())
        return self.url(f"{prefix}/")

    def presigned(self, key: str) -> str:
        """An http:// URL that reads ``key`` for an hour without credentials, its signature in the query (SigV4)."""
        import boto3
        from botocore.config import Config

        signer = boto3.client("s3", config=Config(signature_version="s3v4"))
        return signer.generate_presigned_url("get_object", Params={"Bucket": self.name, "Key": key}, ExpiresIn=3600)


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path) -> S3Bucket:
    """A fresh bucket on the test S3 server; the standard AWS variables point at the server, with test credentials and
    nothing of the user's (~/.aws, AWS_PROFILE, instance roles) in reach."""
    import uuid

    import s3fs

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # fsspec keeps one filesystem per process and thread, made with the environment of its day: a test that changes
    # the environment after reading from the store clears it too
    s3fs.S3FileSystem.clear_instance_cache()
    yield S3Bucket(s3_server, f"crackseg-{uuid.uuid4().hex[:12]}")
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def staging(tmp_path, monkeypatch) -> Path:
    """The temp folder, where predict and compare stage what goes to or comes from the store: to check that nothing
    is left there."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@contextlib.contextmanager
def s3_authentication(endpoint: str):
    """moto checks every request's credentials inside (it accepts any by default): test credentials are then unknown."""
    import urllib.request

    def auth_after(requests: str) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=requests.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=5).close()

    auth_after("0")
    try:
        yield
    finally:
        auth_after("inf")


@contextlib.contextmanager
def served(folder: Path):
    """The http://127.0.0.1:PORT/ URL ``folder`` is served at while the context lasts: a real HTTP server on
    loopback, in a thread."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_folder(tmp_path):
    """(a folder, the http://127.0.0.1:PORT/ URL it is served at)."""
    folder = tmp_path / "served"
    folder.mkdir()
    with served(folder) as url:
        yield folder, url
