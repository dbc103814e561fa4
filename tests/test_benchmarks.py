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
