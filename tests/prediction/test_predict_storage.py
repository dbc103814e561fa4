"""predict with photos in object storage: moto's S3 server and an HTTP server on loopback, against the same photos on disk."""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import re
import socket
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import (
    S3_KEY_ID,
    S3_SECRET,
    cli_result,
    csv_rows,
    pavement,
    predict_cli,
    predict_tiled,
    read_mask,
    s3_authentication,
    write_geotiff,
)

import crackseg.data.inputs as inputs_module
import crackseg.prediction.predict as predict_module


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
    listed = inputs_module.list_files

    def listed_then_deleted(*args):  # another process removes a photo after predict listed it
        found = listed(*args)
        s3.client.delete_object(Bucket=s3.name, Key="survey/photos/b.jpg")
        return found

    monkeypatch.setattr(inputs_module, "list_files", listed_then_deleted)
    assert predict_cli("--checkpoint", checkpoint, prefix, "--out", tmp_path / "out") == 1
    errors = {row["path"]: row["error"] for row in csv_rows(tmp_path / "out" / "errors.csv")}
    assert errors == {prefix + "b.jpg": "not found", prefix + "broken.jpg": "not a readable image (empty, or another kind of file)"}
    assert sorted(p.name for p in (tmp_path / "out" / "masks").iterdir()) == ["a.png"]


def test_an_object_that_is_no_picture_is_refused_from_its_header(s3, photos, tmp_path, checkpoint, monkeypatch):
    """A 20 MB object named .jpg that is not a picture: refused after its first 64 KiB, never downloaded whole."""
    from crackseg.core.storage import RemoteFile

    (photos / "huge.jpg").write_bytes(b"PK\x03\x04" + bytes(20 * 2**20))  # a zip archive, say
    prefix = s3.upload(photos, "survey/photos")
    whole = []
    read_bytes = RemoteFile.read_bytes
    monkeypatch.setattr(RemoteFile, "read_bytes", lambda self: whole.append(self.name) or read_bytes(self))  # records each
    assert predict_cli("--checkpoint", checkpoint, prefix, "--out", tmp_path / "out", "--recursive") == 1
    errors = {row["path"]: row["error"] for row in csv_rows(tmp_path / "out" / "errors.csv")}
    assert errors == {prefix + "huge.jpg": "not a readable image (empty, or another kind of file)"}
    assert "huge.jpg" not in whole and sorted(p.name for p in (tmp_path / "out" / "masks").rglob("*.png")) == ["a.png", "b.png", "c.png"]


def test_a_url_that_is_no_picture_is_refused_from_its_header(photos, http_folder, tmp_path, checkpoint, monkeypatch):
    """The same over http(s)://: its first 64 KiB read, never the whole file."""
    import shutil

    from crackseg.core.storage import RemoteFile

    served, base = http_folder
    (served / "huge.jpg").write_bytes(b"PK\x03\x04" + bytes(20 * 2**20))
    shutil.copyfile(photos / "a.jpg", served / "a.jpg")
    whole = []
    read_bytes = RemoteFile.read_bytes
    monkeypatch.setattr(RemoteFile, "read_bytes", lambda self: whole.append(self.name) or read_bytes(self))
    assert predict_cli("--checkpoint", checkpoint, base + "huge.jpg", base + "a.jpg", "--out", tmp_path / "out") == 1
    errors = {row["path"]: row["error"] for row in csv_rows(tmp_path / "out" / "errors.csv")}
    assert errors == {base + "huge.jpg": "not a readable image (empty, or another kind of file)"}
    assert "huge.jpg" not in whole and [p.name for p in (tmp_path / "out" / "masks").rglob("*.png")] == ["a.png"]


def test_a_redirect_loop_is_named_as_one(tmp_path, checkpoint, capsys):
    import http.server
    import threading

    class Loop(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(302)
            self.send_header("Location", self.path + "x")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/photo.jpg"
        assert predict_cli("--checkpoint", checkpoint, url, "--out", tmp_path / "out") in (1, 2)
    finally:
        server.shutdown()
        server.server_close()
    text = capsys.readouterr().err  # the photo is checked before any work: one line
    assert "photo.jpg: too many redirects" in text and "HTTP 0" not in text, text


def _closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("case", ["bucket", "key", "endpoint", "credentials", "out"])
def test_storage_mistakes_are_one_line_naming_the_url_without_credentials(s3, photos, tmp_path, checkpoint, monkeypatch, case):
    s3.upload(photos, "survey/photos")
    url = {"bucket": "s3://crackseg-no-such-bucket/photos/", "key": s3.url("survey/photos/none.jpg")}.get(case, s3.url("survey/photos/"))
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
                "out": "s3://survey/predictions/: no such bucket 'survey'"}[case]
    assert err.startswith(f"crackseg: error: {expected}")
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.fixture
def rasters(tmp_path) -> Path:
    """in/ortho.tif (600 x 700 px, georeferenced, 512 px blocks: read by windows) and in/plain.tif (96 px, not
    georeferenced: read whole, as a photo)."""
    pytest.importorskip("rasterio")
    from PIL import Image

    folder = tmp_path / "in"
    folder.mkdir()
    write_geotiff(folder / "ortho.tif", pavement(600, 700))
    Image.fromarray(pavement(96, 96, seed=1).transpose(1, 2, 0)).save(folder / "plain.tif")
    return folder


def test_rasters_in_s3_are_read_by_windows_as_from_disk(s3, rasters, tmp_path, checkpoint, monkeypatch):
    prefix = s3.upload(rasters, "survey/rasters")
    whole, head, read = predict_module.RemoteFile.read_bytes, predict_module.RemoteFile.read_head, []
    monkeypatch.setattr(predict_module.RemoteFile, "read_bytes", lambda self: read.append(self.name) or whole(self))
    monkeypatch.setattr(predict_module.RemoteFile, "read_head", lambda self, size: read.append(self.name) or head(self, size))
    assert predict_tiled("--checkpoint", checkpoint, rasters, "--out", tmp_path / "local") == 0
    assert predict_tiled("--checkpoint", checkpoint, prefix, "--out", tmp_path / "remote") == 0
    assert read == ["plain.tif"]  # the GeoTIFF went through GDAL's /vsis3/, by windows; the plain TIFF (small: its header
    # read is the whole file) was a photo
    local, remote = (read_mask(tmp_path / out / "masks" / "ortho.tif") for out in ("local", "remote"))
    assert (remote[0] == local[0]).all() and (remote[1] == local[1]).all() and remote[2] == local[2]
    assert remote[2]["crs"] is not None and remote[0].shape == (600, 700)
    assert _outputs(tmp_path / "remote") == _outputs(tmp_path / "local")
    assert [row["path"] for row in csv_rows(tmp_path / "remote" / "predictions.csv")] == [prefix + "ortho.tif", prefix + "plain.tif"]
    _no_secret_in(tmp_path / "remote")


@pytest.mark.parametrize("case", ["key", "endpoint", "gdal endpoint"])
def test_a_raster_the_store_does_not_serve_is_one_line(s3, rasters, tmp_path, checkpoint, monkeypatch, case):
    """After the listing: the key deleted, the endpoint closed, or GDAL's own endpoint (set by the user) closed."""
    import s3fs

    prefix = s3.upload(rasters, "survey/rasters")
    listed = inputs_module.list_files

    def listed_then_broken(*args):
        found = listed(*args)
        if case == "key":
            s3.client.delete_object(Bucket=s3.name, Key="survey/rasters/ortho.tif")
        elif case == "endpoint":
            monkeypatch.setenv("AWS_ENDPOINT_URL", _closed_port())
            monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
            monkeypatch.setenv("GDAL_HTTP_MAX_RETRY", "0")
            s3fs.S3FileSystem.clear_instance_cache()  # made with the endpoint of the listing
        else:
            monkeypatch.setenv("AWS_S3_ENDPOINT", _closed_port().split("://")[1])
            monkeypatch.setenv("GDAL_HTTP_MAX_RETRY", "0")
        return found

    monkeypatch.setattr(inputs_module, "list_files", listed_then_broken)
    code, err = cli_result(["predict", "--checkpoint", checkpoint, prefix, "--out", tmp_path / "out", "--device", "cpu", "--workers", "0"])
    assert code == 2 and err.count("\n") == 1 and S3_KEY_ID not in err and S3_SECRET not in err, err
    expected = {"key": "not found", "endpoint": "cannot connect to http://127.0.0.1:", "gdal endpoint": "cannot read: "}[case]
    assert err.startswith(f"crackseg: error: {prefix}ortho.tif: {expected}"), err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def ranges_served(rasters):
    """(the http://127.0.0.1:PORT/ URL that serves ``rasters`` with byte ranges, as stores and web servers do (the
    ``http_folder`` fixture's http.server answers every GET whole), the (Range header, bytes sent) of each GET)."""
    served = []

    class Ranges(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(rasters), **kwargs)

        def send_head(self):
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if wanted is None or self.command != "GET":
                served.append((self.headers.get("Range"), None)) if self.command == "GET" else None
                return super().send_head()
            data = Path(self.translate_path(self.path)).read_bytes()
            start, end = int(wanted[1]), min(int(wanted[2] or len(data) - 1), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            served.append((wanted[0], end - start + 1))
            return io.BytesIO(data[start : end + 1])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ranges)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", served
    server.shutdown()
    server.server_close()


def test_a_raster_over_http_is_read_by_ranges_as_from_disk(rasters, ranges_served, http_folder, tmp_path, checkpoint):
    base, served = ranges_served
    assert predict_tiled("--checkpoint", checkpoint, base + "ortho.tif", "--out", tmp_path / "remote") == 0
    assert predict_tiled("--checkpoint", checkpoint, rasters / "ortho.tif", "--out", tmp_path / "local") == 0
    local, remote = (read_mask(tmp_path / out / "masks" / "ortho.tif") for out in ("local", "remote"))
    assert (remote[0] == local[0]).all() and (remote[1] == local[1]).all() and remote[2] == local[2]
    assert served and all(sent is not None for _, sent in served)  # range requests only: never the file whole
    assert sum(sent for _, sent in served) <= 1.1 * (rasters / "ortho.tif").stat().st_size, served  # each byte about once
    shutil.copyfile(rasters / "ortho.tif", http_folder[0] / "ortho.tif")  # a server without ranges: one line, no photo
    code, err = cli_result(["predict", "--checkpoint", checkpoint, http_folder[1] + "ortho.tif?X-Amz-Signature=s3cr3t",
                            "--out", tmp_path / "whole", "--device", "cpu", "--workers", "0"])
    ours = [line for line in err.splitlines() if line.startswith("crackseg")]  # beside the server's broken-pipe traceback
    assert code == 2 and ours == [f"crackseg: error: {http_folder[1]}ortho.tif: cannot read: Range downloading not supported by this server!"]


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


def test_a_prefix_lists_its_photos_in_a_local_folder_s_order(s3, photos, tmp_path):
    """By path part, as a local folder is walked: a/b.jpg before a-b.jpg, which a plain string sort puts first."""
    from crackseg.data.inputs import collect_inputs

    folder = tmp_path / "ord"
    (folder / "a").mkdir(parents=True)
    for name in ("a/b.jpg", "a-b.jpg", "a.jpg"):
        shutil.copyfile(photos / "a.jpg", folder / name)
    prefix = s3.upload(folder, "survey/ord")
    local = [name for _, name in collect_inputs([str(folder)], True, tmp_path / "out").photos]
    assert local == ["a/b", "a-b", "a"]
    assert [name for _, name in collect_inputs([prefix], True, tmp_path / "out").photos] == local


def test_a_prefix_names_the_photos_it_holds_in_formats_predict_does_not_read(s3, photos, tmp_path, checkpoint, capsys):
    from crackseg.data.inputs import collect_inputs

    (photos / "sub" / "d.webp").write_bytes((photos / "a.jpg").read_bytes())
    (photos / "e.HEIC").write_bytes(b"not read")
    (photos / "notes.txt").write_text("sidecar files are not photos")
    prefix = s3.upload(photos, "survey/photos")
    assert [str(f) for f in collect_inputs([prefix], recursive=True).left_out] == [prefix + "e.HEIC", prefix + "sub/d.webp"]
    assert [str(f) for f in collect_inputs([prefix]).left_out] == [prefix + "e.HEIC"]
    assert [str(f) for f in collect_inputs([prefix + "sub/*"]).left_out] == [prefix + "sub/d.webp"]
    alone = collect_inputs([prefix + "sub/d.webp"])  # an object named alone is read, whatever its suffix
    assert (alone.left_out, [name for _, name in alone.photos]) == ([], ["d"])
    assert predict_cli("--checkpoint", checkpoint, prefix, "--recursive", "--out", tmp_path / "out") == 0
    printed = [line for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert printed == [f"crackseg: warning: 2 photo(s) in a format predict does not read were left out ({prefix}e.HEIC, {prefix}sub/d.webp): "
                       "convert them to PNG, JPEG or TIFF, or name such a file alone to have Pillow try it"]
    assert [row["path"] for row in csv_rows(tmp_path / "out" / "predictions.csv")] == [prefix + k for k in ("a.jpg", "b.jpg", "sub/c.jpg")]
