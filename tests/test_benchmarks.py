"""Each benchmark mode runs at tiny size (a smoke test: no timing is asserted); the accuracy scripts' figures add up."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import isolated

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"

MODE_ARGUMENTS = {
    "synth": ["--size", "64"],
    "data": ["--size", "64", "--crop-size", "32", "--workers", "0", "1"],
    "evaluate": ["--size", "64"],
    "train": ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "2", "--workers", "0"],
    "strategies": ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "2", "--workers", "0"],
    "predict": ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "4", "--workers", "0"],
    "runtimes": ["--size", "64", "--encoder", "mobilenet_v2"],
    "measure": ["--size", "64"],
    "rasters": [],
    "compare": [],
    "storage": ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "1"],
    "engines": ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "1"],
}

# Modes that fork processes of their own (loader workers) run in a fresh process: the shared worker holds the threads of
# what ran there before (torch's, ONNX Runtime's, OpenVINO's), which a fork does not carry, and it died once in such a mode.
FORKING_MODES = {"data"}


def test_every_benchmark_mode_has_a_smoke_test():
    result = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    choices = re.search(r"\{([a-z,]+)\}", result.stdout).group(1).split(",")
    assert sorted(choices) == sorted(MODE_ARGUMENTS)


@pytest.mark.slow
@pytest.mark.parametrize("mode, extra", MODE_ARGUMENTS.items())
def test_benchmark_mode_runs(tmp_path, mode, extra):
    out = tmp_path / f"{mode}.json"
    argv = [mode, "--quick", "--out", str(out), *extra]
    if mode in FORKING_MODES:
        result = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        printed = result.stdout
    else:
        printed = _script("bench", argv)
    report = json.loads(out.read_text())
    assert report["rows"] and report["environment"]["torch"]
    assert all(row["images_per_s"] > 0 for row in report["rows"] if isinstance(row.get("images_per_s"), float))
    assert "| mode |" in printed


@isolated
def _script(name: str, argv: list[str]) -> str:
    """benchmarks/``name``.py run with ``argv`` as its command line (which its report records), in the one spawned worker
    that every script shares (imports paid once; ONNX Runtime, which bench.py runtimes runs, must not run in the test
    process: see conftest.isolated); what it printed."""
    import contextlib
    import importlib
    import io

    sys.path.insert(0, str(BENCH.parent))  # as running a script does: they import their sibling modules
    sys.argv = [f"{name}.py", *argv]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        importlib.import_module(name).main()
    return printed.getvalue()


def test_recipe_table_gives_mean_and_spread_over_seeds_and_flags_edge_thresholds(tmp_path):
    import torch

    from crackseg.model.checkpoint import FORMAT, VERSION
    from crackseg.evaluation.metrics import BINS, THRESHOLDS

    def reports(folder: Path, f1: float) -> None:
        for tolerance in (0, 2):
            report = {"dataset": {"f1": f1 + tolerance / 10, "iou_crack": f1 / 2}, "ods": {"f1": f1, "threshold": 0.9}, "ois": {"f1": f1}}
            (folder / f"tol{tolerance}").mkdir(parents=True)
            (folder / f"tol{tolerance}" / "report.json").write_text(json.dumps(report))

    edge, inner = float(THRESHOLDS[BINS - 1]), float(THRESHOLDS[BINS // 2 + 100])
    runs = {"cfd-bce-s0": (0.6, inner), "cfd-bce-s1": (0.7, edge), "crack500-bce-s0": (0.5, inner),
            "cfd-bce+dice-sqrt-s0": (0.75, inner), "cfd-bce+dice-sqrt-s1": (0.85, inner), "cfd-bce+dice-sqrt-s2": (0.1, inner),
            "cfd-bce+dice-sqrt-ema-s0": (0.8, inner), "cfd-bce+dice-sqrt-ema-s1": (0.9, inner)}
    for name, (f1, threshold) in runs.items():
        run = tmp_path / name
        run.mkdir()
        torch.save({"format": FORMAT, "version": VERSION, "epoch": 5, "metrics": {"f1": f1, "threshold": threshold}}, run / "best.pt")
        reports(run / "test", f1)
    reports(tmp_path / "crack500-bce-s0" / "cross-cfd", 0.4)
    printed = _script("recipe", ["--runs", str(tmp_path), "table"])
    (line,) = [line for line in printed.splitlines() if line.startswith("| cfd | bce |")]
    cells = [cell.strip() for cell in line.split("|")[1:-1]]
    assert cells[2] == "2" and cells[3] == "0.6500 ± 0.0707" and cells[8] == "0.8500 ± 0.0707"
    assert cells[9] == f"{inner:.4g}, {edge:.4g} (edge)"
    assert "| crack500-bce-s0 | cfd test | 0.4000 | 0.2000 | 0.6000 | 0.6000 | 0.8000 |" in printed
    # seeds 0 and 1 pair with bce's: +0.15 each, beyond a spread of 0.0707 (seed 2 has no partner)
    assert "| cfd | bce+dice-sqrt | bce | 2 | +0.1500 | 0.0707 | yes | +0.1500 | 0.0707 | yes |" in printed
    # the average of the weights is compared with the variant it is added to: +0.05, within the spread
    assert "| cfd | bce+dice-sqrt-ema | bce+dice-sqrt | 2 | +0.0500 | 0.0707 | no | +0.0500 | 0.0707 | no |" in printed


def test_cracks_counts_every_true_crack_in_both_settings(tmp_path):
    import numpy as np
    import torch
    from PIL import Image

    from crackseg.model.checkpoint import save_model
    from crackseg.model.networks import build_model
    from crackseg.data.synth import SynthOptions, write_dataset

    data = tmp_path / "data"
    write_dataset(data, 4, (64, 64), seed=1, options=SynthOptions(truth=True))
    torch.manual_seed(0)
    save_model(build_model("mobilenet_v2"), tmp_path / "model.pt")
    out = tmp_path / "cracks.json"
    printed = _script("cracks", ["--checkpoint", str(tmp_path / "model.pt"), "--data", str(data), "--device", "cpu", "--out", str(out)])
    assert "| setting |" in printed
    report = json.loads(out.read_text())
    assert report["environment"]["command"].startswith("cracks.py")
    before, joined = report["rows"]
    true_cracks = sum(len(set(np.unique(np.asarray(Image.open(path)))) - {0}) for path in (data / "truth").iterdir())
    assert true_cracks > 0
    assert before["join_gap_px"] == before["min_length_px"] == 0 and joined["join_gap_px"] > 0 and joined["min_length_px"] > 0
    for row in (before, joined):
        assert row["true_cracks"] == true_cracks
        assert row["true_found_as_one"] <= row["true_cracks"] and row["false_cracks"] <= row["found_cracks"]
        assert row["share_as_one"] == round(row["true_found_as_one"] / true_cracks, 3)
    # joining pieces and dropping specks can only lower the count of found cracks
    assert joined["found_cracks"] <= before["found_cracks"]


def test_gpu_check_without_a_cuda_device_stops_at_once_in_one_line_with_status_2(tmp_path):
    """benchmarks/gpu_check.sh checks for CUDA before installing or writing anything (CUDA_VISIBLE_DEVICES
    hides any GPU, so this holds on a GPU machine too)."""
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path / "out")}
    started = time.monotonic()
    result = subprocess.run(["bash", str(BENCH.with_name("gpu_check.sh"))], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("gpu_check: no CUDA device: ") and "sees no GPU" in result.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


def test_ranking_table_pairs_the_arms_seed_for_seed(tmp_path):
    from PIL import Image

    pool = ["a", "b", "c", "d"]
    masks = tmp_path / "datasets" / "cfd" / "masks"
    masks.mkdir(parents=True)
    for number, stem in enumerate(pool):  # a: 0 crack pixels of 100, b: 1, c: 2, d: 3
        mask = np.zeros((10, 10), np.uint8)
        mask.flat[:number] = 255
        Image.fromarray(mask).save(masks / f"{stem}.png")
    home = tmp_path / "runs" / "cfd"
    (home / "pool-predictions").mkdir(parents=True)
    (home / "draw.json").write_text(json.dumps({"val": ["v"], "first": ["f"], "pool": pool, "n": 2, "base_epochs": 3, "epochs": 2}))
    (home / "pool-predictions" / "rank.csv").write_text("rank,path,uncertainty,unsure_crack_share\n1,x/d.jpg,0.3,0.1\n2,x/c.jpg,0.2,0.1\n3,x/a.jpg,0.1,0\n4,x/b.jpg,0,0\n")
    for name, f1 in {"base": 0.5, "ranked-s0": 0.7, "ranked-s1": 0.6, "random-s0": 0.6, "random-s1": 0.65}.items():
        for tolerance in (0, 2):
            report = {"dataset": {"f1": f1 + tolerance / 10, "iou_crack": f1 / 2}, "ods": {"f1": f1, "threshold": 0.9}, "ois": {"f1": f1}}
            (home / name / "test" / f"tol{tolerance}").mkdir(parents=True)
            (home / name / "test" / f"tol{tolerance}" / "report.json").write_text(json.dumps(report))
    printed = _script("ranking", ["--root", str(tmp_path / "datasets"), "--runs", str(tmp_path / "runs"), "table", "--dataset", "cfd"])
    assert "| ranked | 2 | 0.6500 ± 0.0707 |" in printed and "| base | 1 | 0.5000 |" in printed
    assert "ranked - random, f1@0, per seed: +0.1000, -0.0500; mean 0.0250 ± 0.1061" in printed
    assert "ranked 0.0250, pool 0.0150" in printed  # the ranked pick (d, c) holds more crack than the pool's mean


def test_generalization_table_gives_each_test_set_its_figures_over_seeds(tmp_path):
    def report(folder: Path, name: str, f1: float, per_mp: float, share: float | None) -> None:
        (folder / name).mkdir(parents=True)
        figures = {"dataset": {"f1": f1}, "ods": {"f1": f1}, "ois": {"f1": f1}, "miou": {"miou": f1 / 2},
                   "false_alarms": {"far_pixels_per_mp": per_mp, "share": share}}
        (folder / name / "report.json").write_text(json.dumps(figures))

    for seed, f1 in ((0, 0.6), (1, 0.7)):
        scored = tmp_path / f"cfd-lite0-imagenet-bf16cl-s{seed}" / "generalization"
        for test in ("cfd", "crack500"):
            for name in ("tol0", "tol2", "scsegamba"):
                report(scored / test, name, f1 if test == "cfd" else f1 - 0.2, 100.0 * (seed + 1), 0.5)
        report(scored / "lookalikes", "tol0", 0.0, 1000.0 + seed, 0.25 * (seed + 1))
    sections = _script("generalization", ["--runs", str(tmp_path), "table"]).split("scored on ")
    crack500 = next(section for section in sections if section.startswith("crack500"))
    assert "| cfd | lite0-imagenet-bf16cl | 2 | 0.4500 ± 0.0707 | 0.4500 ± 0.0707 | 0.4500 ± 0.0707 |" in crack500
    lookalikes = next(section for section in sections if section.startswith("lookalikes"))
    assert "| cfd | lite0-imagenet-bf16cl | 2 | 1000.5000 ± 0.7071 | 0.3750 ± 0.1768 |" in lookalikes


def test_gpu_levers_without_a_cuda_device_says_so_in_one_line_with_status_2():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, str(BENCH.with_name("gpu_levers.py"))], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and result.stderr == "gpu_levers.py: no CUDA device\n" and result.stdout == ""


def test_survey_edge_scores_only_the_surveyed_pixels(tmp_path, dark_checkpoint):
    """A model that looks at each pixel alone predicts the survey the same whatever lies outside it: no fill differs."""
    from PIL import Image

    from conftest import pavement

    for index, dataset in enumerate(("cfd", "crack500-subset", "walls-mixed")):
        for part in ("images", "masks"):
            (tmp_path / dataset / part).mkdir(parents=True)
        pixels = pavement(96, 240, seed=index).transpose(1, 2, 0)
        Image.fromarray(pixels).save(tmp_path / dataset / "images" / "a.png")
        Image.fromarray(((pixels[..., 0] < 100) * 255).astype("uint8")).save(tmp_path / dataset / "masks" / "a.png")
        (tmp_path / dataset / "test.txt").write_text("a\n")
    printed = _script("survey_edge", ["--root", str(tmp_path), "--model", str(dark_checkpoint), "--per-dataset", "1"])
    rows = [line.split(" | ") for line in printed.splitlines() if line.startswith("| ") and line[2:].split(" |")[0] in
            ("black", "white", "grey", "nearest")]
    assert printed.startswith("3 photos") and len(rows) == 4
    assert {tuple(row[1:]) for row in rows} == {tuple(rows[0][1:])} and rows[0][-1] == "0 |"
    assert rows[0][2] != "0"  # the dark lines inside the survey are found, and scored

