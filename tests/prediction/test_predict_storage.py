"""predict with photos in object storage: moto's S3 server and an HTTP server on loopback, against the same photos on disk."""

from __future__ import annotations

import contextlib
import os
import socket
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import S3_KEY_ID, S3_SECRET, cli_result, csv_rows, predict_cli, s3_authentication

import crackseg.prediction.predict as predict_module
from crackseg.model.checkpoint import save_model


@pytest.fixture(scope="module")
def checkpoint(model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.pt"
    model.threshold = 0.5
    save_model(model, path)
    return path


@pytest.fixture
def photos(synth_root, tmp_path) -> Path:
    """in/a.jpg, in/b.jpg, in/sub/c.jpg: 64 px synthetic crack photos."""
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    sources = sorted((synth_root / "images").glob("*.jpg"))
    for source, target in zip(sources, ("a.jpg", "b.jpg", "sub/c.jpg")):
        shutil.copyfile(source, folder / target)
    return folder


def _outputs(out: Path) -> tuple[dict, list[dict], list[dict]]:
    """(every picture's bytes by its path below out, predictions.csv's rows and cracks.csv's (in any order: the table is
    sorted by path) without path and mask)."""
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.suffix in (".png", ".jpg")}
    rows = [{k: v for k, v in row.items() if k not in ("path", "mask")} for row in csv_rows(out / "predictions.csv")]
    cracks = sorted(({k: v for k, v in row.items() if k != "path"} for row in csv_rows(out / "cracks.csv")), key=lambda r: sorted(r.items()))
    return files, rows, cracks


def _no_secret_in(out: Path) -> None:
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert S3_KEY_ID.encode() not in data and S3_SECRET.encode() not in data and b"X-Amz" not in data, path


def test_an_s3_prefix_gives_what_the_same_local_folder_gives(s3, photos, tmp_path, checkpoint):
    prefix = s3.upload(photos, "survey/photos")
    flags = ["--recursive", "--overlay", "--px-size", 0.5]
    assert predict_cli("--checkpoint", checkpoint, photos, "--out", tmp_path / "local", *flags) == 0
    assert predict_cli("--checkpoint", checkpoint, prefix, "--out", tmp_path / "remote", *flags, "--report") == 0
    local, remote = _outputs(tmp_path / "local"), _outputs(tmp_path / "remote")
    assert sorted(local[0]) == ["masks/a.png", "masks/b.png", "masks/sub/c.png", "overlays/a.jpg", "overlays/b.jpg", "overlays/sub/c.jpg"]
    assert remote == local
    assert [row["path"] for row in csv_rows(tmp_path / "remote" / "predictions.csv")] == [prefix + k for k in ("a.jpg", "b.jpg", "sub/c.jpg")]
    assert (tmp_path / "remote" / "report.html").exists()
    _no_secret_in(tmp_path / "remote")


def test_single_objects_http_and_presigned_urls(s3, photos, http_folder, tmp_path, checkpoint):
    served, base = http_folder
    shutil.copyfile(photos / "b.jpg", served / "b.jpg")
    s3.upload(photos, "survey/photos")
    inputs = [s3.url("survey/photos/a.jpg"), base + "b.jpg", s3.presigned("survey/photos/sub/c.jpg")]
    assert predict_cli("--checkpoint", checkpoint, *inputs, "--out", tmp_path / "remote") == 0
    assert predict_cli("--checkpoint", checkpoint, photos / "a.jpg", photos / "b.jpg", photos / "sub" / "c.jpg", "--out", tmp_path / "local") == 0
    assert _outputs(tmp_path / "remote") == _outputs(tmp_path / "local")
    shown = [row["path"] for row in csv_rows(tmp_path / "remote" / "predictions.csv")]
    assert shown == [inputs[0], base + "b.jpg", f"{s3.endpoint}/{s3.name}/survey/photos/sub/c.jpg"]
    _no_secret_in(tmp_path / "remote")


def test_a_photo_that_fails_to_download_or_decode_is_listed_in_errors(s3, photos, tmp_path, checkpoint, monkeypatch):
    (photos / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    prefix = s3.upload(photos, "survey/photos")
    listed = predict_module.list_files

    def listed_then_deleted(*args):  # another process removes a photo after predict listed it
        found = listed(*args)
        s3.client.delete_object(Bucket=s3.name, Key="survey/photos/b.jpg")
        return found

    monkeypatch.setattr(predict_module, "list_files", listed_then_deleted)
    assert predict_cli("--checkpoint", checkpoint, prefix, "--out", tmp_path / "out") == 1
    errors = {row["path"]: row["error"] for row in csv_rows(tmp_path / "out" / "errors.csv")}
    assert errors == {prefix + "b.jpg": "not found", prefix + "broken.jpg": "not a readable image (empty, or another kind of file)"}
    assert sorted(p.name for p in (tmp_path / "out" / "masks").iterdir()) == ["a.png"]


def _closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("case", ["bucket", "key", "endpoint", "credentials", "tiff", "out"])
def test_storage_mistakes_are_one_line_naming_the_url_without_credentials(s3, photos, tmp_path, checkpoint, monkeypatch, case):
    s3.upload(photos, "survey/photos")
    s3.put("survey/rasters/ortho.tif", b"II*\x00")
    url = {"bucket": "s3://crackseg-no-such-bucket/photos/", "key": s3.url("survey/photos/none.jpg"),
           "tiff": s3.url("survey/rasters/")}.get(case, s3.url("survey/photos/"))
    out = "s3://survey/predictions" if case == "out" else tmp_path / "out"
    if case == "endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", _closed_port())
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    context = s3_authentication(s3.endpoint) if case == "credentials" else contextlib.nullcontext()
    with context:
        code, err = cli_result(["predict", "--checkpoint", checkpoint, url, "--out", out, "--device", "cpu", "--workers", "0"])
    assert code == 2 and err.count("\n") == 1 and S3_KEY_ID not in err and S3_SECRET not in err
    expected = {"bucket": f"{url}: no such bucket 'crackseg-no-such-bucket'", "key": f"{url}: not found",
                "endpoint": f"{url}: cannot connect to http://127.0.0.1:", "credentials": f"{url}: the endpoint does not know the access key id",
                "tiff": f"{url}ortho.tif: TIFFs from object storage are not supported yet",
                "out": "s3://survey/predictions/: no such bucket 'survey'"}[case]
    assert err.startswith(f"crackseg: error: {expected}")
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.slow
def test_loader_workers_read_remote_photos(s3, photos, tmp_path, checkpoint):
    """As a command (see test_predict's workers test): forked loader workers each open their own connection."""
    prefix = s3.upload(photos, "survey/photos")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    result = subprocess.run([sys.executable, "-m", "crackseg", "predict", prefix, "--recursive", "--checkpoint", str(checkpoint),
                             "--out", str(tmp_path / "workers"), "--device", "cpu", "--workers", "2"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert predict_cli("--checkpoint", checkpoint, photos, "--recursive", "--out", tmp_path / "local") == 0
    assert _outputs(tmp_path / "workers") == _outputs(tmp_path / "local")
