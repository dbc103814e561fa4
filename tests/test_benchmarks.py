"""Each benchmark mode runs at tiny size (a smoke test: no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


@pytest.mark.parametrize("mode, extra", [
    ("synth", ["--size", "64"]),
    ("data", ["--size", "64", "--crop-size", "32", "--workers", "0", "1"]),
    ("evaluate", ["--size", "64"]),
    ("train", ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "2", "--workers", "0"]),
    ("predict", ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "4", "--workers", "0"]),
    ("strategies", ["--size", "64", "--encoder", "mobilenet_v2", "--batch-size", "2", "--workers", "0"]),
    ("runtimes", ["--size", "64", "--encoder", "mobilenet_v2"]),
    ("rasters", []),
])
def test_benchmark_mode_runs(tmp_path, mode, extra):
    out = tmp_path / f"{mode}.json"
    result = subprocess.run([sys.executable, str(BENCH), mode, "--quick", "--out", str(out), *extra],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rows"] and report["environment"]["torch"]
    assert all(row["images_per_s"] > 0 for row in report["rows"] if isinstance(row.get("images_per_s"), float))
    assert "| mode |" in result.stdout


def test_recipe_table_gives_mean_and_spread_over_seeds_and_flags_edge_thresholds(tmp_path):
    import torch

    from crackseg.checkpoint import FORMAT, VERSION
    from crackseg.metrics import BINS, THRESHOLDS

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
    result = subprocess.run([sys.executable, str(BENCH.with_name("recipe.py")), "--runs", str(tmp_path), "table"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("| cfd | bce |")]
    cells = [cell.strip() for cell in line.split("|")[1:-1]]
    assert cells[2] == "2" and cells[3] == "0.6500 ± 0.0707" and cells[8] == "0.8500 ± 0.0707"
    assert cells[9] == f"{inner:.4g}, {edge:.4g} (edge)"
    assert "| crack500-bce-s0 | cfd test | 0.4000 | 0.2000 | 0.6000 | 0.6000 | 0.8000 |" in result.stdout
    # seeds 0 and 1 pair with bce's: +0.15 each, beyond a spread of 0.0707 (seed 2 has no partner)
    assert "| cfd | bce+dice-sqrt | bce | 2 | +0.1500 | 0.0707 | yes | +0.1500 | 0.0707 | yes |" in result.stdout
    # the average of the weights is compared with the variant it is added to: +0.05, within the spread
    assert "| cfd | bce+dice-sqrt-ema | bce+dice-sqrt | 2 | +0.0500 | 0.0707 | no | +0.0500 | 0.0707 | no |" in result.stdout
