"""The command line as a user meets it: help, version, one-line errors with exit status 2."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pytest

from conftest import cli_result

from crackseg.cli.main import build_parser

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crackseg", *args], capture_output=True, text=True, timeout=120)


def test_version():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.startswith("crackseg ")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_defaults(command, capsys):
    assert _main(command, "--help")[0] == 0
    out = capsys.readouterr().out
    assert "usage: crackseg " + command in out and "default" in out
    assert "(default: True)" not in out  # what a --no-X switch stores, not what happens without it


@pytest.mark.parametrize("stop, status", [("ctrl-c", 130), ("sigterm", 143)])
def test_a_stop_that_lands_in_a_finalizer_still_stops_the_command(monkeypatch, tmp_path, stop, status):
    """Python ignores an exception raised inside a finalizer: Ctrl-C or SIGTERM arriving while one runs (a weakref's,
    a file's) is raised again where the command goes on, never lost with the run going on to its end."""
    import time

    from crackseg.cli import data
    from crackseg.core.errors import Terminated

    class Finalized:
        def __del__(self):
            raise Terminated() if stop == "sigterm" else KeyboardInterrupt()  # as the signal's handler raises it there

    steps = []

    def command(options) -> int:
        Finalized()  # collected at once: its finalizer runs here
        while len(steps) < 500:
            steps.append(time.sleep(0.002))
        return 0

    monkeypatch.setattr(data, "_cmd_synth", command)
    # Ctrl-C as from a terminal: a suite started in the background (cmd &) inherits SIGINT ignored, which crackseg leaves so
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, err = _main("synth", str(tmp_path / "out"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == status and len(steps) < 500
    assert "Exception ignored" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, named",
    [
        (["synth", "OUT", "--count", "0"], "--count"),
        (["synth", "OUT", "--size", "abc"], "--size"),
        (["nosuchcommand"], "nosuchcommand"),
    ],
)
def test_bad_values_exit_2_with_one_line(args, named):
    result = _run(*args)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("crackseg") and "error:" in last and named in last
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, named", [
    (["train", "--run", "r", "--data", "d", "--epochs", "0"], "--epochs"),
    (["predict", "in", "--checkpoint", "m.pt", "--out", "o", "--tile", "0"], "--tile"),
    (["evaluate", "--pred", "p", "--gt", "g", "--tolerance", "nan"], "--tolerance"),
    (["convert", "--from", "crackpot"], "--out"),
    (["predict", "in", "--checkpoint", "m.pt", "--out", "o", "--no-such-flag"], "--no-such-flag"),
])
def test_a_mistake_caught_while_parsing_is_one_line_not_the_usage(args, named):
    result = _run(*args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("crackseg: error: ") and named in result.stderr and "--help" in result.stderr


@pytest.mark.parametrize("args", [
    ["export", "m.pt", "--format", "onnx", "--out", "s3://bucket/m.onnx"],
    ["labels", "import", "a.json", "--format", "coco", "--images", "photos", "--out", "s3://bucket/data/"],
    ["train", "--run", "s3://bucket/runs/x", "--data", "d"],
    ["synth", "https://example.org/data"],
])
def test_a_url_where_a_local_path_is_needed_is_one_line_and_makes_no_folder(tmp_path, args):
    """pathlib folds s3://bucket/x into s3:/bucket/x: without the check, a local folder named s3: would be written."""
    result = subprocess.run([sys.executable, "-m", "crackseg", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "a local path is needed here" in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", [["predict", "in", "--checkpoint", "m.pt", "--out", "o"], ["compare", "a", "b", "--out", "o"]])
def test_width_classes_help_lists_every_preset_and_a_bad_name_is_one_line(command):
    import contextlib
    import io

    from crackseg.cracks.widths import WIDTH_CLASS_PRESETS

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command[0], "--help"])
    text = " ".join(out.getvalue().split())  # as argparse wraps it
    for name, preset in WIDTH_CLASS_PRESETS.items():
        assert f"{name} ({preset.title}: {', '.join(f'{edge:g}' for edge in preset.edges_mm)} mm, {preset.graded} width)" in text
    for name in WIDTH_CLASS_PRESETS:
        assert build_parser().parse_args([*command, "--width-classes", name]).width_classes == name
    code, err = _main(*command, "--width-classes", "mbei")
    assert code == 2 and err.count("\n") == 1 and err.startswith("crackseg: error: argument --width-classes: must be bre251, aci224")
    assert "d6433-pcc or increasing widths in mm" in err and "'mbei'" in err


def test_input_error_is_one_line_naming_the_path(tmp_path):
    assert _run("synth", str(tmp_path), "--count", "1", "--size", "32").returncode == 0
    result = _run("synth", str(tmp_path), "--count", "1", "--size", "32")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("crackseg: error: ") and str(tmp_path) in result.stderr


def _main(*args: str) -> tuple[int, str]:
    """Exit status and stderr of ``crackseg ARGS`` run in this process."""
    import contextlib
    import io

    from crackseg.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit:
            code = exit.code
    return code, err.getvalue()


@pytest.mark.parametrize("args, named", [
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--threshold", "1.5"], "--threshold"),
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--overlap", "-1"], "--overlap"),
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--tile", "0"], "--tile"),
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--px-size", "nan"], "--px-size"),
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--px-size", "1e300", "--width-classes", "ec2"], "--px-size"),
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--px-size", "1e-300"], "--px-size"),
    (["compare", "b", "a", "--out", "o", "--px-size", "5e3", "--width-classes", "aci224"], "--px-size"),
    (["export", "m.pt", "--format", "onnx", "--out", "m.onnx", "--px-size", "inf"], "--px-size"),
    (["predict", "x.jpg", "--checkpoint", "m.pt", "--out", "o", "--workers", "-1"], "--workers"),
    (["evaluate", "--pred", "p", "--gt", "g", "--tolerance", "-1"], "--tolerance"),
    (["evaluate", "--pred", "p", "--gt", "g", "--tolerance", "1000"], "--tolerance"),
    (["evaluate", "--pred", "p", "--gt", "g", "--threshold", "inf"], "--threshold"),
    (["train", "--data", "d", "--run", "r", "--lr", "0"], "--lr"),
    (["train", "--data", "d", "--run", "r", "--keep-last", "0"], "--keep-last"),
    (["train", "--data", "d", "--run", "r", "--pos-weight", "0"], "--pos-weight"),
    (["synth", "OUT", "--seed", "-3"], "--seed"),
    (["convert", "c.pt", "--arch", "unet16", "--out", "m.pt", "--threshold", "-0.1"], "--threshold"),
    (["labels", "import", "a.json", "--format", "coco", "--images", "i", "--out", "o", "--line-width", "0"], "--line-width"),
    (["labels", "rank", "p", "--top", "0"], "--top"),
    (["labels", "rank", "p", "--threshold", "1.5"], "--threshold"),
    (["labels", "export", "p", "--format", "yolo", "--out", "o"], "--format"),
    (["labels", "export", "p", "--format", "coco", "--out", "o", "--rle", "--polygons"], "--polygons"),
])
def test_out_of_range_numbers_are_one_line_errors(args, named):
    code, err = _main(*args)
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("crackseg: error: ") and named in err


@pytest.mark.parametrize("device, message", [
    ("foo", "--device: must be auto, cpu, cuda or cuda:N (crackseg runs on cpu or cuda), got 'foo'"),
    ("mps", "crackseg runs on cpu or cuda"),
    pytest.param("cuda", "--device cuda: no CUDA GPU is visible", marks=pytest.mark.skipif(
        __import__("torch").cuda.is_available(), reason="a GPU is present")),
])
def test_devices_that_are_not_there_are_one_line_errors(tmp_path, device, message):
    for args in (["predict", str(tmp_path), "--checkpoint", "m.pt", "--out", str(tmp_path / "o")],
                 ["train", "--data", str(tmp_path), "--run", str(tmp_path / "r")]):
        code, err = _main(*args, "--device", device)
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_output_paths_that_are_files_are_refused_before_work(tmp_path):
    (tmp_path / "file").write_text("x")
    for args in (["synth", str(tmp_path / "file"), "--count", "1"],
                 ["train", "--data", str(tmp_path), "--run", str(tmp_path / "file"), "--device", "cpu"],
                 ["evaluate", "--pred", str(tmp_path), "--gt", str(tmp_path), "--out", str(tmp_path / "file")]):
        code, err = _main(*args)
        assert code == 2 and err.count("\n") == 1 and "is a file, not a folder" in err, (args, err)


@pytest.mark.parametrize("command", [
    ["inspect", "{visit1}"],
    ["compare", "{visit1}", "{visit2}", "--out", "{out}/changes"],
    ["labels", "import", "{out}/labels.json", "--format", "coco", "--images", "{visit1}/images", "--out", "{out}/imported"],
])
def test_commands_without_a_model_start_without_torch(tmp_path, command):
    """inspect, compare of dataset folders and labels run in a fresh interpreter that never loads torch."""
    from crackseg.data.later_visit import write_later_visit
    from crackseg.data.synth import write_dataset

    visit1, visit2, out = tmp_path / "visit1", tmp_path / "visit2", tmp_path / "out"
    write_dataset(visit1, 3, (64, 64), seed=0)
    write_later_visit(visit2, visit1, seed=1)
    out.mkdir()
    (out / "labels.json").write_text('{"images": [{"id": 1, "file_name": "00000.jpg", "width": 64, "height": 64}], '
                                     '"annotations": [{"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, '
                                     '"segmentation": [[10, 10, 50, 12, 50, 14, 10, 12]]}], '
                                     '"categories": [{"id": 1, "name": "crack"}]}')
    argv = [part.format(visit1=visit1, visit2=visit2, out=out) for part in command]
    code = (f"import sys; from crackseg.cli.main import main; code = main({argv!r}); "
            "sys.exit(10 + code if 'torch' in sys.modules else code)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_running_out_of_memory_is_one_line(tmp_path):
    """Sizes this machine cannot hold: not a traceback, but what ran out and which flags make the work smaller."""
    code, err = _main("synth", str(tmp_path / "huge"), "--size", "100000000", "--count", "1")
    assert code == 1 and err.count("\n") == 1 and err.startswith("crackseg: error: out of memory (MemoryError: "), err
    assert err.rstrip().endswith("(--size)") and not (tmp_path / "huge").exists()  # no empty dataset folders left behind


def test_a_list_value_starting_with_a_minus_is_checked_as_a_value(tmp_path):
    """argparse took "-1,2" after a flag for another option ("expected one argument"); the value's own problem is said."""
    code, err = _main("predict", str(tmp_path), "--out", str(tmp_path / "out"), "--px-size", "0.5", "--width-classes", "-1,2")
    assert code == 2 and "--width-classes: widths must be positive and increasing (mm), got '-1,2'" in err, err
    code, err = _main("train", "--data", str(tmp_path), "--data-weights", "-1,1", "--run", str(tmp_path / "run"))
    assert code == 2 and "--data-weights: must be > 0, got -1" in err, err


def _mistakes(tmp_path, synth_root, checkpoint) -> dict[str, tuple[list, str]]:
    """Mistakes that ran on as if meant (an empty path is the current folder; a flag that changes nothing, a folder
    of another kind), each with the words of its one line."""
    dataset = tmp_path / "dataset"
    shutil.copytree(synth_root, dataset)
    model, photos = str(checkpoint), str(synth_root / "images")
    return {
        "synth into ''": (["synth", ""], "empty"),
        "predict ''": (["predict", "--checkpoint", model, "", "--out", tmp_path / "p"], "empty"),
        "evaluate --out ''": (["evaluate", "--pred", synth_root / "masks", "--gt", synth_root / "masks", "--out", ""], "empty"),
        "serve on every interface": (["serve", "label-studio", "--checkpoint", model, "--host", ""], "--host: empty"),
        "predict into a dataset": (["predict", "--checkpoint", model, photos, "--out", dataset], "a dataset (images/ and masks/)"),
        "train into a dataset": (["train", "--run", dataset, "--data", synth_root, "--epochs", "1"], "a dataset (images/)"),
        "width classes unmeasured": (["predict", "--checkpoint", model, photos, "--out", tmp_path / "p", "--no-measure",
                                      "--px-size", "1", "--width-classes", "bre251"], "--width-classes applies to the measured"),
        "min length unmeasured": (["predict", "--checkpoint", model, photos, "--out", tmp_path / "p", "--no-measure",
                                   "--min-length", "50"], "--min-length applies to the measured"),
        "--data beside --pred": (["evaluate", "--pred", synth_root / "masks", "--gt", synth_root / "masks", "--data", synth_root],
                                 "--data goes with --checkpoint"),
        "--gt beside --checkpoint": (["evaluate", "--checkpoint", model, "--data", synth_root, "--gt", synth_root / "masks"],
                                     "--gt scores files already predicted"),
        "photos as masks": (["inspect", synth_root, "--masks", photos, "--images", photos], "one folder"),
        "coco into a .txt": (["labels", "export", tmp_path / "p", "--format", "coco", "--out", tmp_path / "l.txt"],
                             "a coco file is a .json file"),
        "safetensors into a .onnx": (["export", model, "--format", "safetensors", "--out", tmp_path / "m.onnx"],
                                     "a safetensors model is a folder"),
    }


@pytest.mark.parametrize("case", ["synth into ''", "predict ''", "evaluate --out ''", "serve on every interface",
                                  "predict into a dataset", "train into a dataset", "width classes unmeasured",
                                  "min length unmeasured", "--data beside --pred", "--gt beside --checkpoint", "photos as masks",
                                  "coco into a .txt", "safetensors into a .onnx"])
def test_mistakes_that_ran_on_as_if_meant_are_one_line(tmp_path, synth_root, checkpoint, case, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, said = _mistakes(tmp_path, synth_root, checkpoint)[case]
    if argv[:2] == ["labels", "export"]:
        assert cli_result(["predict", "--checkpoint", checkpoint, synth_root / "images", "--out", tmp_path / "p"])[0] == 0
    before = sorted(path.name for path in tmp_path.iterdir())
    code, err = cli_result(argv)
    assert code == 2 and err.count("\n") == 1 and said in err, err
    assert sorted(path.name for path in tmp_path.iterdir()) == before  # nothing written
