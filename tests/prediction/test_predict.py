from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli_result, csv_rows, predict_cli
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.prediction.local_engine import default_workers
from crackseg.data.inputs import collect_inputs

ROOT = Path(__file__).resolve().parents[2]


def _photos(folder: Path, sizes) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for index, (height, width) in enumerate(sizes):
        path = folder / f"img{index}.jpg"
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_masks_have_the_input_size_for_odd_sizes_and_tiles(tmp_path, checkpoint):
    sizes = [(37, 53), (64, 64), (300, 700)]
    _photos(tmp_path / "in", sizes)
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--tile", 256, "--overlap", 32,
                    "--overlay", "--save-prob", 16, "--px-size", 0.5) == 0
    for index, (height, width) in enumerate(sizes):
        mask = np.asarray(Image.open(tmp_path / "out" / "masks" / f"img{index}.png"))
        assert mask.shape == (height, width) and set(np.unique(mask)) <= {0, 255}
        prob = Image.open(tmp_path / "out" / "probs" / f"img{index}.png")
        assert prob.size == (width, height) and np.asarray(prob).dtype == np.uint16
        assert Image.open(tmp_path / "out" / "overlays" / f"img{index}.jpg").size == (width, height)
    rows = csv_rows(tmp_path / "out" / "predictions.csv")
    assert [row["path"] for row in rows] == [str(tmp_path / "in" / f"img{i}.jpg") for i in range(3)]
    assert all(row["status"] == "ok" and "length_mm" in row for row in rows)
    assert (tmp_path / "out" / "cracks.csv").exists()
    assert not list((tmp_path / "out").rglob("*crackseg-tmp*"))


def test_no_measure_writes_the_same_masks_without_measurements(tmp_path, checkpoint):
    _photos(tmp_path / "in", [(40, 56), (64, 64)])
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--px-size", 0.5) == 0
    measured = {p.name: p.read_bytes() for p in (tmp_path / "out" / "masks").iterdir()}
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--px-size", 0.5,
                    "--no-measure", "--overwrite") == 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "masks").iterdir()} == measured
    assert not (tmp_path / "out" / "cracks.csv").exists()  # it described the replaced masks
    rows = csv_rows(tmp_path / "out" / "predictions.csv")
    assert len(rows) == 2 and all(float(row["area_mm2"]) == int(row["area_px"]) * 0.25 for row in rows)
    assert not {"cracks", "length_px", "mean_width_px", "max_width_px", "length_mm"} & set(rows[0])


def test_masks_thresholded_where_the_model_runs_are_those_of_the_probabilities(tmp_path, checkpoint):
    """Without --save-prob, one-tile photos come back as masks; tiled ones are thresholded after blending. Either way
    the masks and measurements are those of a run that keeps the probabilities."""
    _photos(tmp_path / "in", [(40, 56), (64, 64), (100, 150)])
    flags = ["--checkpoint", checkpoint, tmp_path / "in", "--tile", 64, "--overlap", 16, "--px-size", 0.5]
    assert predict_cli(*flags, "--out", tmp_path / "probe", "--save-prob", 16) == 0
    levels = np.concatenate([np.asarray(Image.open(path)).ravel() for path in (tmp_path / "probe" / "probs").iterdir()])
    threshold = (float(np.median(levels)) + 0.5) / 65535  # between two stored levels: about half the pixels are crack
    outputs = []
    for out, extra in (("kept", ["--save-prob", 16]), ("masks", [])):
        assert predict_cli(*flags, "--out", tmp_path / out, "--threshold", threshold, *extra) == 0
        masks = {p.name: np.asarray(Image.open(p)) for p in sorted((tmp_path / out / "masks").iterdir())}
        outputs.append((masks, (tmp_path / out / "cracks.csv").read_text()))
    assert not (tmp_path / "masks" / "probs").exists()
    (kept, kept_cracks), (masks, mask_cracks) = outputs
    assert sorted(kept) == sorted(masks) == ["img0.png", "img1.png", "img2.png"] and mask_cracks == kept_cracks
    for name in kept:
        assert np.array_equal(kept[name], masks[name]), name
        assert 0.05 < (masks[name] > 0).mean() < 0.95, name


@pytest.mark.slow
def test_loader_workers_and_measuring_processes_give_what_the_main_process_gives(tmp_path, checkpoint):
    """The run with loader workers is a command: they leave a SIGCHLD handler in the process that started them,
    which crashed this test process later, once OpenVINO had run in it (a CLI run is one process)."""
    _photos(tmp_path / "in", [(40, 56), (64, 64), (33, 47), (70, 90), (50, 52)])
    (tmp_path / "in" / "broken.jpg").write_bytes(b"not an image")
    flags = [str(tmp_path / "in"), "--checkpoint", str(checkpoint), "--overlay", "--save-prob", "8", "--px-size", "0.5"]
    assert predict_cli(*flags, "--out", tmp_path / "out0") == 1
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    assert subprocess.run([sys.executable, "-m", "crackseg", "predict", *flags, "--out", str(tmp_path / "out2"), "--device", "cpu",
                           "--workers", "2"], env=env, capture_output=True).returncode == 1
    outputs = []
    for out in (tmp_path / "out0", tmp_path / "out2"):
        files = {p.relative_to(out).as_posix(): p.read_bytes() for folder in ("masks", "probs", "overlays")
                 for p in (out / folder).iterdir()}
        rows = [{k: v for k, v in row.items() if k != "mask"} for row in csv_rows(out / "predictions.csv")]
        outputs.append((files, rows, (out / "cracks.csv").read_text(), len(csv_rows(out / "errors.csv"))))
    assert outputs[0] == outputs[1] and len(outputs[0][0]) == 15 and len(outputs[0][1]) == 5 and outputs[0][3] == 1
    masks_only = [flag for flag in flags if flag not in ("--save-prob", "8")]  # masks, not probabilities, sent to the processes
    assert subprocess.run([sys.executable, "-m", "crackseg", "predict", *masks_only, "--out", str(tmp_path / "masks2"),
                           "--device", "cpu", "--workers", "2"], env=env, capture_output=True).returncode == 1
    masks = {p.name: p.read_bytes() for p in (tmp_path / "masks2" / "masks").iterdir()}
    assert masks == {name.split("/", 1)[1]: data for name, data in outputs[0][0].items() if name.startswith("masks/")}
    assert (tmp_path / "masks2" / "cracks.csv").read_text() == outputs[0][2]


def test_jpegs_decoded_on_the_device_in_batches_give_what_pillow_gives(tmp_path, checkpoint, synth_root, monkeypatch):
    """--decode device on the CPU runs the GPU's path with torchvision's CPU decoder: JPEGs in batches (3 here), the
    rest by Pillow in the workers; the outputs are the same files. Grey, CMYK, EXIF-turned, progressive, broken and
    truncated JPEGs and a PNG are among them: a batch the decoder refuses is decoded by Pillow, file by file."""
    import crackseg.prediction.local_engine as local_engine

    monkeypatch.setattr(local_engine, "DECODE_BATCH", 3)
    batches = []
    decode_batch = local_engine.decode_batch
    monkeypatch.setattr(local_engine, "decode_batch", lambda raws, device: batches.append(len(raws)) or decode_batch(raws, device))
    folder = tmp_path / "in"
    photos = [Image.open(path).convert("RGB") for path in sorted((synth_root / "images").glob("*.jpg"))[:4]]
    folder.mkdir()
    for index, photo in enumerate(photos):
        photo.save(folder / f"plain{index}.jpg", quality=90)
    photos[0].convert("L").save(folder / "grey.jpg")
    photos[1].convert("CMYK").save(folder / "cmyk.jpg")
    photos[2].save(folder / "progressive.jpg", progressive=True)
    turned = Image.Exif()
    turned[0x0112] = 6
    photos[3].save(folder / "turned.jpg", exif=turned)
    photos[0].save(folder / "lossless.png")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    whole = (folder / "plain0.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(whole[: len(whole) // 2])  # its header reads: the device's batch fails, Pillow too
    outputs = []
    for decode in ("workers", "device"):
        out = tmp_path / decode
        assert predict_cli("--checkpoint", checkpoint, folder, "--out", out, "--decode", decode, "--overlay", "--px-size", "0.5") == 1
        files = {p.relative_to(out).as_posix(): p.read_bytes() for kind in ("masks", "overlays") for p in (out / kind).iterdir()}
        rows = [{k: v for k, v in row.items() if k != "mask"} for row in csv_rows(out / "predictions.csv")]
        outputs.append((files, rows, (out / "cracks.csv").read_text(), csv_rows(out / "errors.csv")))
    assert batches == [3, 3, 1]  # the plain, grey, progressive and truncated JPEGs; the CMYK and turned ones by Pillow
    assert outputs[0] == outputs[1]
    assert len(outputs[0][1]) == 9 and sorted(row["path"].rsplit("/", 1)[1] for row in outputs[0][3]) == ["broken.jpg", "truncated.jpg"]


def test_decode_with_ray_is_a_one_line_error(tmp_path, checkpoint):
    code, err = cli_result(["predict", tmp_path, "--checkpoint", checkpoint, "--out", tmp_path / "out", "--engine", "ray",
                            "--decode", "device"])
    assert code == 2 and err == "crackseg: error: --decode applies to --engine local; Ray's actors decode what they read\n"


def _running_in_group(group: int) -> list[int]:
    """The processes of a process group that have not ended (an ended one may wait, a zombie, for a busy init to reap it)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            running.append(int(stat.parent.name))
    return running


@pytest.mark.slow
def test_ctrl_c_stops_the_measuring_processes_with_the_run_and_leaves_only_whole_files(tmp_path, checkpoint):
    """Ctrl-C reaches every process of the terminal's group: the run ends with 130 and no traceback, its measuring
    processes end with it, and what it wrote is whole (no temp file, no lock); --skip-existing then finishes the rest."""
    _photos(tmp_path / "in", [(256, 256)] * 20)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    command = [sys.executable, "-m", "crackseg", "predict", str(tmp_path / "in"), "--checkpoint", str(checkpoint),
               "--out", str(tmp_path / "out"), "--device", "cpu", "--workers", "2", "--overlay"]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    masks = tmp_path / "out" / "masks"
    deadline = time.monotonic() + 240
    while not (masks.is_dir() and len(list(masks.glob("*.png"))) >= 3) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    time.sleep(1)
    assert not _running_in_group(run.pid)
    written = sorted(p.name for p in masks.glob("*.png"))
    assert 3 <= len(written) < 20
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.startswith(".") or "crackseg-tmp" in p.name]
    for path in masks.glob("*.png"):
        Image.open(path).load()  # whole
    assert predict_cli(str(tmp_path / "in"), "--checkpoint", checkpoint, "--out", tmp_path / "out", "--overlay", "--skip-existing") == 0
    rows = csv_rows(tmp_path / "out" / "predictions.csv")
    assert len(rows) == 20 and sum(row["status"] == "skipped: exists" for row in rows) == len(written)


def test_default_workers_leave_cpu_cores_to_the_model_and_share_them_on_gpu_machines(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_workers(torch.device("cpu")) == 0
    assert default_workers(torch.device("cuda", 0)) == 8  # at most 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_workers(torch.device("cuda", 3)) == 3  # 16 cores / 4 processes, less the process's own


def test_channels_last_gives_the_probabilities_of_the_default_layout(tmp_path, checkpoint, monkeypatch):
    import crackseg.prediction.predict as predict_module

    layouts = []
    real = predict_module.Predictor
    monkeypatch.setattr(predict_module, "Predictor", lambda model, *args: layouts.append(
        next(model.parameters()).is_contiguous(memory_format=torch.channels_last)) or real(model, *args))
    _photos(tmp_path / "in", [(48, 72)])
    for out, flags in (("default", []), ("nhwc", ["--channels-last"])):
        assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / out, "--save-prob", "16", *flags) == 0
    assert layouts == [False, True]
    probs = [np.asarray(Image.open(tmp_path / out / "probs" / "img0.png"), dtype=np.float64) / 65535 for out in ("default", "nhwc")]
    assert np.abs(probs[0] - probs[1]).max() < 1e-4


def test_corrupt_input_is_listed_and_the_rest_written(tmp_path, checkpoint):
    _photos(tmp_path / "in", [(32, 32), (32, 32)])
    (tmp_path / "in" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 1
    assert sorted(p.name for p in (tmp_path / "out" / "masks").iterdir()) == ["img0.png", "img1.png"]
    (error,) = csv_rows(tmp_path / "out" / "errors.csv")
    assert error["path"].endswith("broken.jpg") and error["error"]


def test_existing_outputs_need_overwrite_or_skip_existing(tmp_path, checkpoint, capsys):
    photos = _photos(tmp_path / "in", [(32, 32), (32, 48)])
    assert predict_cli("--checkpoint", checkpoint, photos[0], "--out", tmp_path / "out") == 0
    first = tmp_path / "out" / "masks" / "img0.png"
    first.write_bytes(first.read_bytes())  # marker: any rewrite changes the modification time
    os.utime(first, (1, 1))
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 2
    assert "already exist" in capsys.readouterr().err and first.stat().st_mtime == 1
    assert not (tmp_path / "out" / "masks" / "img1.png").exists()
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--skip-existing") == 0
    assert first.stat().st_mtime == 1 and (tmp_path / "out" / "masks" / "img1.png").exists()
    statuses = [row["status"] for row in csv_rows(tmp_path / "out" / "predictions.csv")]
    assert statuses == ["skipped: exists", "ok"]
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--overwrite") == 0
    assert first.stat().st_mtime != 1


@pytest.mark.skipif(os.name == "nt", reason="Windows file names are text, never bytes that are not UTF-8")
def test_a_photo_whose_name_is_not_utf8_is_found_again_by_skip_existing_overwrite_and_the_report(tmp_path, checkpoint):
    """predictions.csv holds such a name's bytes as \\xNN; read back, the name finds its files again."""
    photos = _photos(tmp_path / "in", [(32, 32), (32, 48)])
    odd = photos[0].rename(photos[0].with_name(os.fsdecode(b"fissur\xe9.png")))
    out = tmp_path / "out"
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out) == 0
    mask = out / "masks" / odd.name
    os.utime(mask, (1, 1))
    (out / "masks" / "img1.png").unlink()
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--skip-existing", "--report") == 0
    assert mask.stat().st_mtime == 1
    assert [row["status"] for row in csv_rows(out / "predictions.csv")] == ["skipped: exists", "ok"]
    assert '"name": "fissur\\\\xe9"' in (out / "report.html").read_text()  # shown as the tables write it
    odd.unlink()
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--overwrite") == 0
    assert sorted(path.name for path in (out / "masks").iterdir()) == ["img1.png"]  # the earlier run's mask of it removed


def test_skip_existing_refuses_tables_of_inputs_it_does_not_predict_and_clears_a_stale_cracks_csv(tmp_path, checkpoint, capsys):
    """The tables --skip-existing writes list this run's inputs: an earlier run's rows of other photos would be dropped."""
    photos = _photos(tmp_path / "in", [(32, 32), (32, 48)])
    out = tmp_path / "out"
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out) == 0
    tables = {name: (out / name).read_bytes() for name in ("predictions.csv", "cracks.csv", "summary.json")}
    capsys.readouterr()
    assert predict_cli("--checkpoint", checkpoint, photos[1], "--out", out, "--skip-existing") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lists 1 images this run does not predict (e.g. img0)" in err
    assert {name: (out / name).read_bytes() for name in tables} == tables
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--skip-existing", "--no-measure") == 0
    assert not (out / "cracks.csv").exists(), "a cracks.csv left beside tables of a run that did not measure"


def test_skip_existing_keeps_the_uncertainty_of_the_probabilities_it_keeps(tmp_path, checkpoint, capsys):
    """labels rank and a table sorted by uncertainty need the columns for every photo, kept or predicted again."""
    _photos(tmp_path / "in", [(32, 32), (32, 48), (40, 40)])
    args = ["--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--save-prob", "8"]
    assert predict_cli(*args) == 0
    first = csv_rows(tmp_path / "out" / "predictions.csv")
    (tmp_path / "out" / "masks" / "img1.png").unlink()
    assert predict_cli(*args, "--skip-existing") == 0
    again = csv_rows(tmp_path / "out" / "predictions.csv")
    assert [row["status"] for row in again] == ["skipped: exists", "ok", "skipped: exists"]
    assert [list(row) for row in again] == [list(row) for row in first]  # the same columns, in the same order
    assert [{k: v for k, v in row.items() if k != "status"} for row in again] == [{k: v for k, v in row.items() if k != "status"} for row in first]
    (tmp_path / "out" / "probs" / "img2.png").write_bytes(b"torn")
    capsys.readouterr()
    assert predict_cli(*args, "--skip-existing") == 0
    assert f"{tmp_path / 'out' / 'probs' / 'img2.png'}: the probability map an earlier run wrote is not readable" in capsys.readouterr().err
    assert [row["status"] for row in csv_rows(tmp_path / "out" / "predictions.csv")] == ["skipped: exists", "skipped: exists", "ok"]


def _files(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def test_overwrite_removes_what_an_earlier_run_wrote_that_this_one_does_not(tmp_path, checkpoint):
    photos = _photos(tmp_path / "in" / "sub", [(32, 32), (32, 48), (40, 32)])
    out = tmp_path / "out"
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--recursive", "--out", out, "--save-prob", "8", "--overlay",
                       "--vectors", "geojson", "--report") == 0
    before = _files(out)
    assert {"probs/sub/img2.png", "overlays/sub/img2.jpg", "vectors/sub/img2.geojson", "report/thumbs/sub/img2.jpg",
            "report.html"} <= set(before)
    (out / "masks" / "mine.png").write_bytes(b"a user's file, listed in no table")
    (out / "notes.txt").write_text("kept")
    photos[1].write_bytes(b"\xff\xd8\xff no longer a photo")  # fails this time: its earlier outputs are not this run's
    photos[2].unlink()
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--recursive", "--out", out, "--overwrite") == 1
    assert _files(out) == ["cracks.csv", "errors.csv", "masks/mine.png", "masks/sub/img0.png", "notes.txt", "predictions.csv",
                           "summary.json"]
    assert sorted(path.name for path in out.iterdir() if path.is_dir()) == ["masks"]  # emptied folders go too
    assert [row["mask"] for row in csv_rows(out / "predictions.csv")] == [str(out / "masks" / "sub" / "img0.png")]


@pytest.mark.parametrize("table", [b"", b"\xff\xfe garbage \x81", b"x,y\n1,2\n"])
def test_overwrite_replaces_a_predictions_table_that_cannot_be_read(tmp_path, checkpoint, table):
    photos = _photos(tmp_path / "in", [(32, 32)])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "predictions.csv").write_bytes(table)
    assert predict_cli("--checkpoint", checkpoint, photos[0], "--out", tmp_path / "out", "--overwrite") == 0
    assert [row["path"] for row in csv_rows(tmp_path / "out" / "predictions.csv")] == [str(photos[0])]


def test_a_report_of_earlier_tables_is_removed_when_they_are_written_again_without_one(tmp_path, checkpoint):
    photos = _photos(tmp_path / "in", [(32, 32), (32, 48)])
    out = tmp_path / "out"
    assert predict_cli("--checkpoint", checkpoint, photos[0], "--out", out, "--report") == 0
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--skip-existing") == 0
    assert not (out / "report.html").exists() and (out / "masks" / "img0.png").exists()
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--skip-existing", "--report") == 0
    assert "img1" in (out / "report.html").read_text()


def test_tables_without_rows_have_every_column_and_are_reported(tmp_path, checkpoint):
    """A survey of crack-free walls gives a cracks.csv without rows, and one of photos that all fail a predictions.csv
    without rows: both keep their columns, which report (and any reader) needs."""
    from crackseg.cli.main import main

    _photos(tmp_path / "in", [(32, 32), (40, 32)])
    flags = ["--px-size", 0.5, "--width-classes", "0.1,0.3", "--save-prob", 8, "--report"]
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "some", *flags, "--threshold", 0.0) == 0
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "none", *flags, "--threshold", 1.0) == 0
    some, none = (tmp_path / "some" / "cracks.csv").read_text(), (tmp_path / "none" / "cracks.csv").read_text()
    assert some.count("\n") > 1 and none == some.splitlines()[0] + "\n"
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["cracks"] == 0
    assert "report.html" in os.listdir(tmp_path / "none") and main(["report", str(tmp_path / "none")]) == 0
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jpg").write_text("not a photo")
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "bad", "--out", tmp_path / "failed", *flags) == 1
    header = (tmp_path / "failed" / "predictions.csv").read_text()
    assert header == (tmp_path / "some" / "predictions.csv").read_text().splitlines()[0] + "\n"
    assert (tmp_path / "failed" / "report.html").is_file() and len(csv_rows(tmp_path / "failed" / "errors.csv")) == 1


@pytest.mark.parametrize("table", ["summary.json", "cracks.csv", "report.html", "errors.csv"])
def test_a_table_of_another_run_is_not_replaced_without_overwrite(tmp_path, checkpoint, capsys, table):
    photo = _photos(tmp_path / "in", [(32, 32)])[0]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / table).write_text("an earlier run's")
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", tmp_path / "out", "--report") == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and table in error and "--overwrite" in error
    assert (tmp_path / "out" / table).read_text() == "an earlier run's" and not (tmp_path / "out" / "masks").exists()
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", tmp_path / "out", "--report", "--overwrite") == 0


def test_one_predict_at_a_time_per_output_folder(tmp_path, checkpoint, capsys):
    import json
    import socket

    photo = _photos(tmp_path / "in", [(32, 32)])[0]
    out = tmp_path / "out"
    out.mkdir()
    live = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": None, "since": "now", "job": None, "attempt": 0}
    (out / "lock").write_text(json.dumps(live))
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", out) == 2
    error = capsys.readouterr().err
    assert f"in use by pid {os.getpid()}" in error and "another --out" in error and not (out / "masks").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / "lock").write_text(json.dumps({**live, "pid": dead.pid}))
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", out) == 0
    assert "taking it over" in capsys.readouterr().err and not (out / "lock").exists() and (out / "masks" / "img0.png").exists()


def test_a_name_that_looks_like_a_formula_is_text_in_every_table(tmp_path, checkpoint, monkeypatch):
    source = _photos(tmp_path / "in", [(48, 48)])[0]
    monkeypatch.chdir(tmp_path / "in")
    os.rename(source, tmp_path / "in" / "=HYPERLINK(1).jpg")
    assert predict_cli("--checkpoint", checkpoint, "=HYPERLINK(1).jpg", "--out", tmp_path / "out", "--threshold", "0.3") == 0
    rows = csv_rows(tmp_path / "out" / "predictions.csv")
    assert rows[0]["path"] == "'=HYPERLINK(1).jpg" and float(rows[0]["crack_fraction"]) > 0
    cracks = csv_rows(tmp_path / "out" / "cracks.csv")
    assert cracks and all(row["path"] == "'=HYPERLINK(1).jpg" for row in cracks)


def test_threshold_comes_from_the_checkpoint_unless_given(tmp_path, checkpoint, model):
    (photo,) = _photos(tmp_path / "in", [(48, 48)])
    with torch.no_grad():
        prob = torch.sigmoid(model(torch.from_numpy(np.array(Image.open(photo))).permute(2, 0, 1)[None]))[0, 0].numpy()
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", tmp_path / "a") == 0
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", tmp_path / "b", "--threshold", float(np.median(prob))) == 0
    a = np.asarray(Image.open(tmp_path / "a" / "masks" / "img0.png")) > 0
    b = np.asarray(Image.open(tmp_path / "b" / "masks" / "img0.png")) > 0
    assert np.array_equal(a, prob >= 0.5)
    assert b.mean() == pytest.approx(0.5, abs=0.05)


def test_two_processes_write_every_output_once(tmp_path, checkpoint):
    _photos(tmp_path / "in", [(32, 32)] * 5)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHON"] = sys.executable
    result = subprocess.run(
        ["bash", str(ROOT / "launch.sh"), "--nproc", "2", "predict", "--checkpoint", str(checkpoint), str(tmp_path / "in"),
         "--out", str(tmp_path / "out"), "--device", "cpu", "--workers", "0", "--threshold", "0"],  # every pixel crack: warned
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = csv_rows(tmp_path / "out" / "predictions.csv")
    assert sorted(row["path"] for row in rows) == sorted(str(tmp_path / "in" / f"img{i}.jpg") for i in range(5))
    assert len({row["path"] for row in rows}) == 5
    assert len(list((tmp_path / "out" / "masks").iterdir())) == 5
    assert result.stderr.count("of the pixels predicted are crack") == 1  # rank 0 alone warns
    assert len(json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"]) == 1


def test_inputs_mirror_names_and_refuse_collisions(tmp_path):
    _photos(tmp_path / "a" / "sub", [(8, 8)])
    _photos(tmp_path / "a", [(8, 8)])
    _photos(tmp_path / "b", [(8, 8)])
    listed = collect_inputs([str(tmp_path / "a")], recursive=True).photos
    assert [name for _, name in listed] == ["img0", "sub/img0"]
    with pytest.raises(InputError, match="would both be written as img0.png"):
        collect_inputs([str(tmp_path / "a" / "img0.jpg"), str(tmp_path / "b" / "img0.jpg")])
    with pytest.raises(InputError, match="no such file or folder"):
        collect_inputs([str(tmp_path / "nothing*.jpg")])



def test_photos_in_formats_predict_does_not_read_are_named_in_a_warning(tmp_path, checkpoint, capsys):
    _photos(tmp_path / "in" / "sub", [(32, 32)])
    Image.new("RGB", (32, 32)).save(tmp_path / "in" / "a.webp")
    Image.new("RGB", (32, 32)).save(tmp_path / "in" / "sub" / "b.GIF")
    (tmp_path / "in" / "notes.txt").write_text("sidecar files are not photos")
    assert collect_inputs([str(tmp_path / "in")], recursive=True).left_out == [tmp_path / "in" / "a.webp", tmp_path / "in" / "sub" / "b.GIF"]
    assert collect_inputs([str(tmp_path / "in" / "*" / "*")]).left_out == [tmp_path / "in" / "sub" / "b.GIF"]
    assert collect_inputs([str(tmp_path / "in" / "a.webp")]).left_out == []  # a file named alone is read, whatever its suffix
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--recursive", "--out", tmp_path / "out") == 0
    printed = [line for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert printed == [f"crackseg: warning: 2 photo(s) in a format predict does not read were left out ({tmp_path / 'in' / 'a.webp'}, "
                       f"{tmp_path / 'in' / 'sub' / 'b.GIF'}): convert them to PNG, JPEG or TIFF, or name such a file alone to "
                       "have Pillow try it"]
    assert printed[0].removeprefix("crackseg: warning: ") in json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"]
    assert [row["path"] for row in csv_rows(tmp_path / "out" / "predictions.csv")] == [str(tmp_path / "in" / "sub" / "img0.jpg")]
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in" / "a.webp", "--out", tmp_path / "one") == 0
    assert len(csv_rows(tmp_path / "one" / "predictions.csv")) == 1

def test_a_recursive_walk_reads_linked_folders_once_and_ends_where_links_lead_back(tmp_path, checkpoint):
    """A survey whose site folders are links (to a NAS, another disk) is read through them; a link to a folder the
    walk reads anyway adds no second name for its photos, and a link back up ends."""
    _photos(tmp_path / "nas" / "site2", [(32, 32)])
    _photos(tmp_path / "survey" / "site1", [(32, 32)] * 2)
    (tmp_path / "survey" / "site2").symlink_to(tmp_path / "nas" / "site2", target_is_directory=True)
    (tmp_path / "survey" / "again").symlink_to(tmp_path / "nas" / "site2", target_is_directory=True)
    (tmp_path / "survey" / "latest").symlink_to(tmp_path / "survey" / "site1", target_is_directory=True)
    (tmp_path / "survey" / "site1" / "up").symlink_to(tmp_path / "survey", target_is_directory=True)
    (tmp_path / "survey" / "gone").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    names = [name for _, name in collect_inputs([str(tmp_path / "survey")], recursive=True).photos]
    assert names == ["again/img0", "site1/img0", "site1/img1"]  # site2 is again's folder, walked once, by name order
    assert [name for _, name in collect_inputs([str(tmp_path / "survey" / "site2")], recursive=True).photos] == ["img0"]
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "survey", "--recursive", "--out", tmp_path / "out") == 0
    assert sorted(p.relative_to(tmp_path / "out" / "masks").as_posix() for p in (tmp_path / "out" / "masks").rglob("*.png")) == \
        ["again/img0.png", "site1/img0.png", "site1/img1.png"]


def test_an_output_file_where_another_input_needs_a_folder_is_refused_before_any_work(tmp_path, checkpoint, capsys):
    _photos(tmp_path / "in" / "a.png", [(32, 32)])  # a folder named a.png: its img0.jpg goes to masks/a.png/img0.png
    _photos(tmp_path / "in", [(32, 32)])[0].rename(tmp_path / "in" / "a.jpg")  # and a.jpg's mask is masks/a.png
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--recursive", "--out", tmp_path / "out") == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{tmp_path / 'in' / 'a.jpg'} and {tmp_path / 'in' / 'a.png' / 'img0.jpg'}" in error, error
    assert f"output {tmp_path / 'out' / 'masks' / 'a.png'} is the folder" in error and not (tmp_path / "out").exists()


def test_outputs_inside_a_recursive_input_are_never_read_again(tmp_path, checkpoint):
    _photos(tmp_path / "din", [(32, 32)] * 4)
    for flag in ("--overwrite", "--overwrite", "--skip-existing"):
        assert predict_cli("--checkpoint", checkpoint, tmp_path / "din", "--recursive", "--out", tmp_path / "din" / "pred",
                        "--overlay", flag) == 0
        assert len(csv_rows(tmp_path / "din" / "pred" / "predictions.csv")) == 4
    assert len(list((tmp_path / "din" / "pred" / "masks").rglob("*.png"))) == 4
    with pytest.raises(InputError, match="is inside --out"):
        collect_inputs([str(tmp_path / "din" / "pred" / "masks" / "img0.png")], out=tmp_path / "din" / "pred")
    _photos(tmp_path / "same", [(32, 32)] * 2)  # photos predicted into their own folder: said, not "no images"
    with pytest.raises(InputError, match=r"same: is --out .*same or inside it, where predict writes; .* choose another --out"):
        collect_inputs([str(tmp_path / "same")], out=tmp_path / "same")
    with pytest.raises(InputError, match=r"every file it matches is inside --out"):
        collect_inputs([str(tmp_path / "same" / "*.jpg")], out=tmp_path / "same")


def test_skip_existing_keeps_no_mask_that_another_model_threshold_or_tiling_made(tmp_path, checkpoint, capsys):
    """A batch finished with other settings would mix two kinds of masks under one summary: the first kept mask made
    otherwise refuses the run before any work; a later one (a folder that mixes runs already) is predicted again."""
    _photos(tmp_path / "in", [(32, 32)] * 3)
    out, masks = tmp_path / "out", tmp_path / "out" / "masks"
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--threshold", 0.5) == 0
    before = {path.name: path.read_bytes() for path in masks.iterdir()}
    capsys.readouterr()
    for flags, differs in ((["--threshold", 0.9], "threshold 0.5, not 0.9"), (["--threshold", 0.5, "--tta", "flip"], 'tta "none", not "flip"'),
                           (["--threshold", 0.5, "--tile", 16, "--overlap", 4], "tile 1024, not 16, overlap 128, not 4")):
        assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--skip-existing", *flags) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"{masks / 'img0.png'}: an earlier run made it with {differs}; --skip-existing" in error, error
    copy = tmp_path / "copy.pt"
    copy.write_bytes(Path(checkpoint).read_bytes())  # the same file under another name: the same model
    assert predict_cli("--checkpoint", copy, tmp_path / "in", "--out", out, "--skip-existing", "--threshold", 0.5) == 0
    other = tmp_path / "other.pt"
    torch.save(torch.load(checkpoint, weights_only=True) | {"epoch": 99}, other)  # the same weights: the file's content differs
    assert predict_cli("--checkpoint", other, tmp_path / "in", "--out", out, "--skip-existing", "--threshold", 0.5) == 2
    assert "an earlier run made it with model " in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in masks.iterdir()} == before
    assert predict_cli("--checkpoint", checkpoint, _photos(tmp_path / "one", [(32, 32)])[0], "--out", tmp_path / "b", "--threshold", 0.9) == 0
    (masks / "img1.png").write_bytes((tmp_path / "b" / "masks" / "img0.png").read_bytes())  # made at 0.9, in a folder made at 0.5
    Image.open(masks / "img2.png").save(masks / "img2.png")  # a mask that does not say what made it, as older ones: kept
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", out, "--skip-existing", "--threshold", 0.5) == 0
    assert f"{masks / 'img1.png'}: an earlier run made it with threshold 0.9, not 0.5; predicting" in capsys.readouterr().err
    assert [row["status"] for row in csv_rows(out / "predictions.csv")] == ["skipped: exists", "ok", "skipped: exists"]
    assert (masks / "img1.png").read_bytes() == before["img1.png"]


def test_skip_existing_redoes_an_image_whose_requested_outputs_are_incomplete(tmp_path, checkpoint):
    _photos(tmp_path / "in", [(32, 32), (40, 40)])
    args = ["--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--overlay", "--save-prob", 8]
    assert predict_cli(*args) == 0
    (tmp_path / "out" / "overlays" / "img1.jpg").unlink()
    (tmp_path / "out" / "probs" / "img0.png").unlink()
    assert predict_cli(*args, "--skip-existing") == 0
    assert (tmp_path / "out" / "overlays" / "img1.jpg").exists() and (tmp_path / "out" / "probs" / "img0.png").exists()
    assert [row["status"] for row in csv_rows(tmp_path / "out" / "predictions.csv")] == ["ok", "ok"]
    assert predict_cli(*args, "--skip-existing") == 0
    assert [row["status"] for row in csv_rows(tmp_path / "out" / "predictions.csv")] == ["skipped: exists"] * 2


@pytest.mark.parametrize("damage", [lambda mask: mask.write_bytes(mask.read_bytes()[:60]),  # torn
                                    lambda mask: mask.write_bytes(b""),  # empty
                                    lambda mask: mask.write_text("not a picture")])
def test_skip_existing_redoes_a_damaged_mask_says_so_and_finishes_the_rest(tmp_path, checkpoint, capsys, damage):
    _photos(tmp_path / "in", [(32, 32), (40, 40)])
    args = ["--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out"]
    assert predict_cli(*args) == 0
    before = (tmp_path / "out" / "masks" / "img1.png").read_bytes()
    damage(tmp_path / "out" / "masks" / "img1.png")
    _photos(tmp_path / "more", [(48, 48)])
    (tmp_path / "more" / "img0.jpg").rename(tmp_path / "in" / "new.jpg")  # a photo added since
    capsys.readouterr()
    assert predict_cli(*args, "--skip-existing") == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out' / 'masks' / 'img1.png'}: the mask an earlier run wrote is not readable" in err
    assert f"predicting {tmp_path / 'in' / 'img1.jpg'} again" in err
    assert (tmp_path / "out" / "masks" / "img1.png").read_bytes() == before
    statuses = {row["path"].rsplit("/", 1)[1]: row["status"] for row in csv_rows(tmp_path / "out" / "predictions.csv")}
    assert statuses == {"img0.jpg": "skipped: exists", "img1.jpg": "ok", "new.jpg": "ok"}


def test_out_that_is_a_file_is_refused_before_any_work(tmp_path, checkpoint, capsys):
    _photos(tmp_path / "in", [(32, 32)])
    (tmp_path / "out").write_text("not a folder")
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 2
    assert "--out" in capsys.readouterr().err


def test_interrupted_writes_are_cleared_and_full_disks_reported_per_image(tmp_path, checkpoint):
    """RLIMIT_FSIZE fails every large write as a full disk would: the CSVs still list what was done."""
    import resource
    import signal

    _photos(tmp_path / "in", [(192, 192), (200, 160)])
    (tmp_path / "out" / "masks").mkdir(parents=True)
    orphan = tmp_path / "out" / "masks" / ".img0.png.abcd.crackseg-tmp"
    orphan.write_bytes(b"torn")
    users = [tmp_path / "out" / ".notes.tmp", tmp_path / "out" / "masks" / ".draft.tmp.txt"]  # not crackseg's: kept
    for path in users:
        path.write_text("mine")

    def small_files_only():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, 16_000))

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    result = subprocess.run(
        [sys.executable, "-m", "crackseg", "predict", str(tmp_path / "in"), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"),
         "--save-prob", "16", "--threshold", "1", "--device", "cpu", "--workers", "0"],
        capture_output=True, text=True, env=env, timeout=240, preexec_fn=small_files_only,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert not orphan.exists() and not list((tmp_path / "out").rglob(".*.crackseg-tmp*"))
    assert all(path.read_text() == "mine" for path in users)
    errors = csv_rows(tmp_path / "out" / "errors.csv")
    assert len(errors) == 2 and all("cannot write outputs" in e["error"] and "File too large" in e["error"] for e in errors)
    assert (tmp_path / "out" / "predictions.csv").exists()


@pytest.mark.parametrize("options, message", [
    (dict(threshold=1.5), "--threshold must be in [0, 1]"),
    (dict(overlap=-1), "--overlap must be >= 0"),
    (dict(tile=256, overlap=256), "--overlap (256 px) must be smaller than --tile (256 px)"),
    (dict(scale=dict(px_size=float("nan"))), "--px-size must be a finite number"),
    (dict(workers=-2), "--workers must be >= 0"),
])
def test_options_from_python_are_checked_like_the_flags(tmp_path, options, message):
    from crackseg.cracks.options import Scale
    from crackseg.model.options import InferenceOptions
    from crackseg.prediction.options import PredictOptions

    inference = {name: options.pop(name) for name in ("tile", "overlap") if name in options}
    with pytest.raises(InputError, match=re.escape(message)):
        PredictOptions(out=tmp_path, inference=InferenceOptions(**inference), scale=Scale(**options.pop("scale", {})), **options)


def test_a_name_that_is_not_utf8_is_predicted_and_listed(tmp_path, checkpoint, capsys):
    source = _photos(tmp_path / "in", [(48, 48)])[0]
    name = os.fsdecode(b"caf\xe9")
    os.rename(source, tmp_path / "in" / f"{name}.jpg")
    assert predict_cli("--checkpoint", checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--overlay", "--report") == 0
    assert "Traceback" not in capsys.readouterr().err
    assert (tmp_path / "out" / "masks" / f"{name}.png").exists() and (tmp_path / "out" / "overlays" / f"{name}.jpg").exists()
    text = (tmp_path / "out" / "predictions.csv").read_bytes().decode("utf-8")
    assert "caf\\xe9.jpg" in text


def _grey_photos(folder: Path, dark: int, light: int) -> None:
    """``dark`` photos dark all over (the dark-pixel model calls every pixel crack), then ``light`` light ones with one dark
    line across (the model marks the line: 150 of 2400 px, 6%)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(dark + light):
        photo = np.full((40, 60, 3), 20 if index < dark else 200, np.uint8)
        photo[20:23, 5:55] = 20
        Image.fromarray(photo).save(folder / f"img{index:02d}.png")


def _warnings(out: Path, capsys) -> tuple[list[str], list[str]]:
    """The crack-fraction warnings predict printed, and summary.json's warnings."""
    printed = [line for line in capsys.readouterr().err.splitlines() if "of the pixels predicted are crack" in line]
    return printed, json.loads((out / "summary.json").read_text())["warnings"]


def test_a_run_marking_most_pixels_is_warned_about_and_the_summary_keeps_it(tmp_path, dark_checkpoint, capsys):
    _grey_photos(tmp_path / "in", dark=2, light=1)
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 0  # the status is unchanged
    printed, saved = _warnings(tmp_path / "out", capsys)
    assert len(printed) == 1 and printed[0].startswith("crackseg: warning: ")
    assert "68.8% of the pixels predicted are crack, and 2 of 3 images are mostly crack" in printed[0]  # (2 * 2400 + 150) / 7200
    assert "unlike the model's training photos" in printed[0] and "the threshold (0.5) too low" in printed[0]
    assert saved == [printed[0].removeprefix("crackseg: warning: ")]


def test_a_normal_run_is_not_warned_about(tmp_path, dark_checkpoint, capsys):
    _grey_photos(tmp_path / "in", dark=0, light=3)
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 0
    assert _warnings(tmp_path / "out", capsys) == ([], [])
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "low", "--threshold", "0") == 0
    printed, saved = _warnings(tmp_path / "low", capsys)
    assert "100.0% of the pixels predicted are crack" in printed[0] and "the threshold (0) too low" in saved[0]


def test_a_tenth_of_the_photos_mostly_crack_is_warned_about(tmp_path, dark_checkpoint, capsys):
    """1 of 10 photos mostly crack warns, although the run's pixels are 15.6% crack; 1 of 11 (14.8%) does not."""
    _grey_photos(tmp_path / "in", dark=1, light=10)
    (tmp_path / "in" / "img10.png").rename(tmp_path / "img10.png")
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "ten") == 0
    assert "15.6% of the pixels predicted are crack, and 1 of 10 images are mostly crack" in _warnings(tmp_path / "ten", capsys)[0][0]
    (tmp_path / "img10.png").rename(tmp_path / "in" / "img10.png")
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "eleven") == 0
    assert _warnings(tmp_path / "eleven", capsys) == ([], [])


def test_a_pavement_standard_grades_each_crack_by_its_mean_width_and_a_bridge_one_by_its_max(tmp_path, dark_checkpoint, capsys):
    """A dark 4 px crack with a 14 px knot, at 1 mm per pixel: mean width under 10 mm, max width over it. ASTM D6433
    grades the mean (L), AASHTO MBEI the max (CS3): the length per class, the summary and its line follow the graded
    width, cracks.csv keeps both classes, and --skip-existing gives the same figures."""
    photo = np.full((60, 240, 3), 200, np.uint8)
    photo[28:32, 10:230] = photo[23:37, 100:116] = 20
    (tmp_path / "in").mkdir()
    Image.fromarray(photo).save(tmp_path / "in" / "road.png")
    flags = ["--checkpoint", dark_checkpoint, tmp_path / "in", "--px-size", "1"]
    assert predict_cli(*flags, "--out", tmp_path / "road", "--width-classes", "d6433-ac") == 0
    printed = capsys.readouterr()
    (crack,) = csv_rows(tmp_path / "road" / "cracks.csv")
    assert float(crack["mean_width_mm"]) < 10 <= float(crack["max_width_mm"])
    assert (crack["mean_width_class"], crack["max_width_class"]) == ("L", "M")
    (row,) = csv_rows(tmp_path / "road" / "predictions.csv")
    assert float(row["length_mm[L]"]) == pytest.approx(float(crack["length_mm"])) and float(row["length_mm[M]"]) == 0
    summary = json.loads((tmp_path / "road" / "summary.json").read_text())
    assert summary["width_classes"]["cracks"] == {"L": 1, "M": 0, "H": 0} and summary["warnings"] == []
    assert f"length by mean-width class (ASTM D6433, asphalt), mm: L: {float(crack['length_mm']):g}, M: 0, H: 0" in printed.out
    assert "warning" not in printed.err  # 1 mm per pixel: 10 px across D6433's narrowest band

    assert predict_cli(*flags, "--out", tmp_path / "road", "--width-classes", "d6433-ac", "--skip-existing") == 0
    assert csv_rows(tmp_path / "road" / "predictions.csv")[0] | {"status": "ok"} == row
    assert json.loads((tmp_path / "road" / "summary.json").read_text())["width_classes"] == summary["width_classes"]

    assert predict_cli(*flags, "--out", tmp_path / "bridge", "--width-classes", "mbei-rc") == 0
    (row,) = csv_rows(tmp_path / "bridge" / "predictions.csv")
    assert float(row["length_mm[CS3]"]) == pytest.approx(float(crack["length_mm"])) and float(row["length_mm[CS1]"]) == 0
    err = capsys.readouterr().err
    assert "width classes mbei-rc (AASHTO MBEI, reinforced concrete): the narrowest band is 0.3048 mm" in err
    assert "the classes need a pixel size of 0.102 mm or finer" in err
