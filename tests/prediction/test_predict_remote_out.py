"""predict --out s3://bucket/prefix/: against moto's S3 server on loopback, compared with a local run of the same photos."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from conftest import S3_KEY_ID, S3_SECRET, cli_result, csv_rows, predict_cli

import crackseg.prediction.local_engine as local_engine
from crackseg.prediction.outputs import PredictionsFolder

LOCK_NAME = ".crackseg-predict.lock"  # the lock object of predict

FLAGS = ["--recursive", "--overlay", "--px-size", 0.5]


def _download(s3, prefix: str, folder: Path) -> Path:
    """Every object below ``prefix`` (no trailing /) into ``folder``, by its key below the prefix."""
    for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix=prefix + "/").get("Contents", []):
        target = folder / item["Key"][len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.client.get_object(Bucket=s3.name, Key=item["Key"])["Body"].read())
    return folder


def _keys(s3, prefix: str) -> list[str]:
    return sorted(item["Key"][len(prefix) + 1:] for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix=prefix + "/").get("Contents", []))


def _written(monkeypatch) -> list[str]:
    """The output names of the photos predict writes from now on (a skipped photo is summarised, not written)."""
    names = []
    write = local_engine.write_image_outputs

    def counted(folder, path, name, *args):
        names.append(name)
        return write(folder, path, name, *args)

    monkeypatch.setattr(local_engine, "write_image_outputs", counted)
    return names


def test_s3_in_s3_out_gives_the_outputs_of_a_local_run(s3, photos, tmp_path, checkpoint, staging):
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    assert predict_cli("--checkpoint", checkpoint, photos, "--out", tmp_path / "local", *FLAGS, "--report") == 0
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, *FLAGS, "--report") == 0
    local, remote = tmp_path / "local", _download(s3, "survey/pred", tmp_path / "remote")
    files = [sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) for folder in (local, remote)]
    assert [name for name in files[0] if not name.startswith("report/")] == files[1]  # no lock, no temp name left; the
    # report shows no photo (nor overlay) of a URL input
    for name in (name for name in files[1] if name.endswith((".png", ".jpg"))):
        assert (remote / name).read_bytes() == (local / name).read_bytes(), name
    for table in ("predictions.csv", "cracks.csv"):
        assert [{k: v for k, v in row.items() if k not in ("path", "mask")} for row in csv_rows(remote / table)] == \
            [{k: v for k, v in row.items() if k not in ("path", "mask")} for row in csv_rows(local / table)]
    assert [row["mask"] for row in csv_rows(remote / "predictions.csv")] == [out + f"masks/{n}.png" for n in ("a", "b", "sub/c")]
    downloaded = PredictionsFolder(remote)  # a copy of the prefix is a predictions folder as a local run's is (labels, report)
    assert [downloaded.table_path(row["mask"], "mask", number) for number, row in enumerate(csv_rows(remote / "predictions.csv"), 1)] == \
        [remote / "masks" / f"{n}.png" for n in ("a", "b", "sub/c")]
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in (local, remote)]
    for summary in summaries:
        summary["widest"].pop("path")
    assert summaries[0] == summaries[1]
    assert not any(staging.iterdir())
    for path in remote.rglob("*"):
        assert path.is_dir() or not {S3_KEY_ID.encode(), S3_SECRET.encode()} & {w for w in path.read_bytes().split()}, path


def test_existing_outputs_are_refused_skipped_or_replaced(s3, photos, tmp_path, checkpoint, monkeypatch, capsys, staging):
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive") == 0
    code, err = cli_result(["predict", "--checkpoint", checkpoint, source, "--out", out, "--recursive", "--device", "cpu", "--workers", "0"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"crackseg: error: 6 outputs already exist in {out} (e.g. {out}masks/a.png); pass --skip-existing")
    s3.client.delete_object(Bucket=s3.name, Key="survey/pred/masks/b.png")  # as a run interrupted before b's upload
    written = _written(monkeypatch)
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive", "--skip-existing") == 0
    assert written == ["b"]
    rows = csv_rows(_download(s3, "survey/pred", tmp_path / "skipped") / "predictions.csv")
    assert [row["status"] for row in rows] == ["skipped: exists", "ok", "skipped: exists"]
    assert [row["mask"] for row in rows] == [out + f"masks/{n}.png" for n in ("a", "b", "sub/c")]
    s3.put("survey/pred/masks/a.png", b"torn")  # a damaged mask in the store: named by its object, predicted again
    written.clear()
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive", "--skip-existing") == 0
    said = capsys.readouterr().err
    assert written == ["a"] and f"{out}masks/a.png: the mask an earlier run wrote is not readable" in said
    assert str(staging) not in said  # the object, never the staging copy it was read from
    written.clear()
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive", "--overwrite") == 0
    assert written == ["a", "b", "sub/c"]
    assert _keys(s3, "survey/pred") == ["cracks.csv", "masks/a.png", "masks/b.png", "masks/sub/c.png", "predictions.csv", "summary.json"]
    s3.put("survey/pred/notes.txt", b"kept")
    assert predict_cli("--checkpoint", checkpoint, photos / "a.jpg", "--out", out, "--overwrite", "--save-prob", "8") == 0
    assert _keys(s3, "survey/pred") == ["cracks.csv", "masks/a.png", "notes.txt", "predictions.csv", "probs/a.png", "summary.json"]


def test_a_held_lock_refuses_a_second_run_and_a_run_removes_its_own(s3, photos, checkpoint, monkeypatch, staging):
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    s3.put(f"survey/pred/{LOCK_NAME}", b'{"host": "other"}')
    code, err = cli_result(["predict", "--checkpoint", checkpoint, source, "--out", out, "--device", "cpu", "--workers", "0"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"crackseg: error: {out}{LOCK_NAME}: another predict is writing to {out}; if none is")
    assert f"aws s3 rm {out}{LOCK_NAME}" in err
    assert _keys(s3, "survey/pred") == [LOCK_NAME]  # the other run's lock is left alone
    s3.client.delete_object(Bucket=s3.name, Key=f"survey/pred/{LOCK_NAME}")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(local_engine, "write_image_outputs", interrupted)
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out) == 130
    assert _keys(s3, "survey/pred") == [] and not any(staging.iterdir())


def test_a_store_that_cannot_lock_says_so_and_no_lock_goes_on(s3, photos, checkpoint, monkeypatch):
    import botocore.exceptions
    import s3fs

    async def not_implemented(self, path, data, mode="overwrite", **kwargs):
        answer = {"Error": {"Code": "NotImplemented", "Message": "If-None-Match"}, "ResponseMetadata": {"HTTPStatusCode": 501}}
        raise OSError(errno.ENOSYS, "not implemented") from botocore.exceptions.ClientError(answer, "PutObject")

    monkeypatch.setattr(s3fs.S3FileSystem, "_pipe_file", not_implemented)
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    code, err = cli_result(["predict", "--checkpoint", checkpoint, source, "--out", out, "--device", "cpu", "--workers", "0"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"crackseg: error: {out}{LOCK_NAME}: the store does not support conditional writes")
    assert "pass --no-lock" in err and _keys(s3, "survey/pred") == []
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--no-lock") == 0
    assert _keys(s3, "survey/pred") == ["cracks.csv", "masks/a.png", "masks/b.png", "predictions.csv", "summary.json"]


def test_a_failed_upload_leaves_no_object_and_is_listed_in_errors(s3, photos, tmp_path, checkpoint, monkeypatch):
    import botocore.exceptions
    import s3fs

    call = s3fs.S3FileSystem._call_s3

    async def dropped_for_b(self, method, *args, **kwargs):
        if method == "put_object" and kwargs.get("Key", "").endswith("masks/b.png"):
            raise botocore.exceptions.ConnectionClosedError(endpoint_url=s3.endpoint)
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", dropped_for_b)
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive") == 1
    assert "masks/b.png" not in _keys(s3, "survey/pred") and f"{LOCK_NAME}" not in _keys(s3, "survey/pred")
    errors = csv_rows(_download(s3, "survey/pred", tmp_path / "remote") / "errors.csv")
    assert errors == [{"path": source + "b.jpg", "name": "b", "error": f"cannot write outputs: {out}masks/b.png: cannot connect to {s3.endpoint}: "
                       "check AWS_ENDPOINT_URL and the network"}]
    assert [row["mask"] for row in csv_rows(tmp_path / "remote" / "predictions.csv")] == [out + "masks/a.png", out + "masks/sub/c.png"]


def test_an_http_out_is_refused_in_one_line(photos, checkpoint):
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", "https://host/pred/", "--device", "cpu"])
    assert code == 2 and err == "crackseg: error: --out https://host/pred/: predictions are written to a local folder or an " \
        "s3://bucket/prefix/ URL (http(s):// is read-only)\n"


def test_a_missing_bucket_for_out_is_one_line_and_leaves_nothing(photos, checkpoint, s3, staging):
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", "s3://crackseg-no-such-bucket/pred/", "--device", "cpu"])
    assert (code, err) == (2, "crackseg: error: s3://crackseg-no-such-bucket/pred/: no such bucket 'crackseg-no-such-bucket'\n")
    assert not any(staging.iterdir())


@pytest.mark.slow
def test_a_raster_from_the_store_goes_back_as_cogs_equal_to_a_local_runs(s3, tmp_path, dark_checkpoint, staging):
    rasterio = pytest.importorskip("rasterio")
    from conftest import pavement, predict_tiled, write_geotiff

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(700, 600))
    source, out = s3.upload(tmp_path / "in", "survey/ortho"), s3.url("survey/pred/")
    flags = ["--model", dark_checkpoint, "--save-prob", 8, "--overviews"]
    assert predict_tiled(tmp_path / "in", "--out", tmp_path / "local", *flags) == 0
    assert predict_tiled(source, "--out", out, *flags) == 0
    remote = _download(s3, "survey/pred", tmp_path / "remote")
    for name in ("masks/ortho.tif", "probs/ortho.tif"):
        assert (remote / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
        with rasterio.open(remote / name) as cog:
            assert cog.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG" and cog.overviews(1)
    modified = s3.client.head_object(Bucket=s3.name, Key="survey/pred/masks/ortho.tif")["LastModified"]
    assert predict_tiled(source, "--out", out, *flags, "--skip-existing") == 0
    assert s3.client.head_object(Bucket=s3.name, Key="survey/pred/masks/ortho.tif")["LastModified"] == modified
    (again,) = csv_rows(_download(s3, "survey/pred", tmp_path / "again") / "predictions.csv")
    ((first,),) = [csv_rows(remote / "predictions.csv")]
    assert again["status"] == "skipped: exists" and again["cracks"] == first["cracks"] != "0"
    assert not any(staging.iterdir())


@pytest.mark.slow
def test_torchrun_processes_write_to_the_store_what_one_process_writes(s3, photos, tmp_path, dark_checkpoint):
    """Each process uploads its photos' files; the parts of a raster reach rank 0 through the store, as from another machine."""
    import os
    import subprocess
    import sys

    pytest.importorskip("rasterio")
    from conftest import pavement, write_geotiff

    write_geotiff(photos / "ortho.tif", pavement(700, 500))
    source = s3.upload(photos, "survey/photos")
    common = ["predict", "--model", str(dark_checkpoint), source, "--recursive", "--save-prob", "8", "--device", "cpu",
              "--workers", "0", "--tile", "256", "--overlap", "32"]
    assert cli_result([*common, "--out", s3.url("one/")])[0] == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")} | {"PYTHON": sys.executable}
    launch = Path(__file__).resolve().parents[2] / "launch.sh"
    two = subprocess.run(["bash", str(launch), "--nproc", "2", *common, "--out", s3.url("two/")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert _keys(s3, "one") == _keys(s3, "two") and "masks/ortho.tif" in _keys(s3, "two")  # no part, no lock left
    for key in _keys(s3, "one"):
        content = [s3.client.get_object(Bucket=s3.name, Key=f"{prefix}/{key}")["Body"].read() for prefix in ("one", "two")]
        assert content[0].replace(b"/one/", b"/two/") == content[1], (key, content)


def test_sigterm_ends_a_run_into_the_store_as_ctrl_c_does(s3, synth_root, tmp_path, checkpoint):
    """What a scheduler or kubectl delete sends: no lock object, no staging folder, exit status 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    photos = tmp_path / "many"
    photos.mkdir()
    for index in range(120):  # enough that the run is still going when the signal comes
        (photos / f"p{index:03d}.jpg").write_bytes(sorted((synth_root / "images").glob("*.jpg"))[index % 12].read_bytes())
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    staging = tmp_path / "tmp"
    staging.mkdir()
    command = [sys.executable, "-m", "crackseg", "predict", "--checkpoint", str(checkpoint), source, "--out", out,
               "--device", "cpu", "--workers", "0", "--overlay"]
    process = subprocess.Popen(command, env={**os.environ, "TMPDIR": str(staging)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(key.startswith("masks/") for key in _keys(s3, "survey/pred")):
        time.sleep(0.1)  # the lock is taken and the first photos are uploaded
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "crackseg: terminated (SIGTERM)" in err and "Traceback" not in err
    assert LOCK_NAME not in _keys(s3, "survey/pred") and not any(staging.iterdir())
    assert len(_keys(s3, "survey/pred")) < 120  # stopped part way: the rest is for --skip-existing


def test_a_store_that_dies_mid_run_says_what_is_missing_and_skip_existing_finishes_exactly_that(
        s3, photos, tmp_path, checkpoint, monkeypatch, staging):
    """The server goes away after the first photo's outputs are stored: the run stops at once naming what the prefix
    lacks, leaves nothing staged, and a rerun from this host (taking over the lock the dead run could not remove)
    predicts exactly the rest, into tables equal to a run that never failed."""
    import os
    import subprocess
    import sys

    import s3fs
    from services import Relay

    relay = Relay(s3.endpoint.split("://")[1], cut_at=b"/survey/pred/masks/b.png")
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    command = ["predict", "--checkpoint", str(checkpoint), source, "--out", out, "--recursive", "--device", "cpu", "--workers", "0"]
    died = subprocess.run([sys.executable, "-m", "crackseg", *command], env={**os.environ, "TMPDIR": str(staging)},
                          capture_output=True, text=True, timeout=300)
    assert died.returncode == 2 and "Traceback" not in died.stderr and "Task exception" not in died.stderr, died.stderr
    assert died.stderr.splitlines()[-1] == (
        f"crackseg: error: {out}masks/b.png: the store stopped answering (cannot connect to {relay.endpoint}: check "
        f"AWS_ENDPOINT_URL and the network): {out} lacks the outputs of 2 of 3 inputs ({source}b.jpg, {source}sub/c.jpg) "
        "and the tables; rerun with --skip-existing to finish exactly those")
    assert _keys(s3, "survey/pred") == [LOCK_NAME, "masks/a.png"] and not any(staging.iterdir())

    relay.restore()
    written = _written(monkeypatch)
    code, err = cli_result([*command, "--skip-existing"])
    assert code == 0 and f"{out}{LOCK_NAME}: left by pid " in err and "no longer running; taking it over" in err, err
    assert written == ["b", "sub/c"] and not any(staging.iterdir())
    assert predict_cli("--checkpoint", checkpoint, photos, "--out", tmp_path / "local", "--recursive") == 0
    remote = _download(s3, "survey/pred", tmp_path / "remote")
    assert sorted(p.relative_to(remote).as_posix() for p in remote.rglob("*")) == \
        sorted(p.relative_to(tmp_path / "local").as_posix() for p in (tmp_path / "local").rglob("*"))
    for table in ("predictions.csv", "cracks.csv"):
        assert [{k: v for k, v in row.items() if k not in ("path", "mask", "status")} for row in csv_rows(remote / table)] == \
            [{k: v for k, v in row.items() if k not in ("path", "mask", "status")} for row in csv_rows(tmp_path / "local" / table)]
    assert [row["status"] for row in csv_rows(remote / "predictions.csv")] == ["skipped: exists", "ok", "ok"]


@pytest.mark.parametrize("where", ["store", "local"])
def test_a_full_disk_stops_the_run_naming_the_folder_and_the_photos_left(where, s3, photos, tmp_path, checkpoint, monkeypatch,
                                                                       staging):
    """No space left where the outputs are written (the staging folder of a store, or a local --out): every later
    photo would fail the same way, so the run stops, naming the folder and the photos it could not write."""
    write = local_engine.write_image_outputs

    def full_at_b(folder, path, name, *args):
        if name == "b":
            raise OSError(errno.ENOSPC, "No space left on device", str(folder.mask(name)))
        return write(folder, path, name, *args)

    monkeypatch.setattr(local_engine, "write_image_outputs", full_at_b)
    source = s3.upload(photos, "survey/photos") if where == "store" else f"{photos}/"
    out = s3.url("survey/pred/") if where == "store" else str(tmp_path / "pred")
    code, err = cli_result(["predict", "--checkpoint", checkpoint, source, "--out", out, "--recursive", "--device", "cpu",
                            "--workers", "0"])
    left = f"the outputs of 2 of 3 inputs ({source}b.jpg, {source}sub/c.jpg) and the tables; rerun with --skip-existing"
    if where == "store":
        (folder,) = {line.split("no space left in ")[1].split(",")[0] for line in err.splitlines() if "no space left" in line}
        assert Path(folder).parent == staging and not any(staging.iterdir())
        assert err.splitlines()[-1] == (f"crackseg: error: no space left in {folder}, the staging folder of {out} (set TMPDIR to a "
                                        f"folder with room): {out} lacks {left} to finish exactly those")
        assert _keys(s3, "survey/pred") == ["masks/a.png"]
    else:
        assert err.splitlines()[-1] == f"crackseg: error: no space left in {out}: {out} lacks {left} to finish exactly those"
        assert sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*")) == ["masks", "masks/a.png"]
    assert code == 2 and "Traceback" not in err


def test_skip_existing_on_a_store_keeps_the_uncertainty_of_the_probabilities_there(s3, photos, tmp_path, checkpoint, staging):
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/unc/")
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive", "--save-prob", "8") == 0
    first = csv_rows(_download(s3, "survey/unc", tmp_path / "first") / "predictions.csv")
    s3.client.delete_object(Bucket=s3.name, Key="survey/unc/masks/b.png")
    assert predict_cli("--checkpoint", checkpoint, source, "--out", out, "--recursive", "--save-prob", "8", "--skip-existing") == 0
    again = csv_rows(_download(s3, "survey/unc", tmp_path / "again") / "predictions.csv")
    assert [row["status"] for row in again] == ["skipped: exists", "ok", "skipped: exists"]
    assert [row["uncertainty"] for row in again] == [row["uncertainty"] for row in first] and all(r["uncertainty"] for r in again)
