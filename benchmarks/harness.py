"""What every benchmark shares: timed windows and their medians, device figures, the report.

A figure is the median over several timed windows after a warm-up window; a report is the
rows as a Markdown table on stdout and, with the environment they were measured in, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Hashable

import torch

import crackseg

RESULTS = Path(__file__).resolve().parent / "results"
TESTS = Path(__file__).resolve().parents[1] / "tests"  # services.py: the suite's real services, which benchmarks start too

# Dense bf16 / fp16 tensor-core peaks from NVIDIA's datasheets, by a part of the device name.
PEAK_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.5, "H100 NVL": 835.5, "H200": 989.4, "A100": 312.0}

RunWindow = Callable[[int], object]  # runs one window; given its index (0 is the warm-up)


def median_rates(paths: dict[Hashable, tuple[RunWindow, int]], windows: int,
                 warmup: bool = True) -> dict[Hashable, tuple[float, list[float]]]:
    """Items per second of each path {name: (run_window, items per window)}: a warm-up round, then the median of ``windows`` rounds.

    Every round runs each path once in turn, so a shared machine's slow drifts (clock,
    neighbours, warming caches) hit all paths alike instead of whichever ran first.
    ``warmup`` False (a --quick smoke run, whose figures mean nothing) leaves the warm-up round out.
    Returns {name: (median rate, the rate of every timed window)}.
    """
    rates: dict[Hashable, list[float]] = {name: [] for name in paths}
    for index in range(0 if warmup else 1, windows + 1):  # round 0 is the warm-up
        for name, (run_window, items) in paths.items():
            start = time.perf_counter()
            run_window(index)
            if index:
                rates[name].append(items / (time.perf_counter() - start))
    return {name: (statistics.median(values), values) for name, values in rates.items()}


def median_rate(run_window: RunWindow, items_per_window: int, windows: int) -> tuple[float, list[float]]:
    """``median_rates`` of a single path."""
    return median_rates({"": (run_window, items_per_window)}, windows)[""]


def window_count(args: argparse.Namespace, default: int) -> int:
    """Timed windows after the warm-up: --windows, else the mode's default, else 1 with --quick."""
    return args.windows or (1 if args.quick else default)


def device_sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so that a window's time includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far in MiB: allocated GPU memory on CUDA, else this process's peak RSS."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def flops_per_image(model: torch.nn.Module, size: int, device: torch.device, train: bool) -> int:
    """FLOPs of one size x size image: forward, plus backward when ``train`` (torch.utils.flop_counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    image = torch.randint(0, 256, (1, 3, size, size), dtype=torch.uint8, device=device)
    with FlopCounterMode(display=False) as counter:
        if train:
            model(image).sum().backward()
        else:
            with torch.no_grad():
                model(image)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def compute_figures(flops: int, images_per_s: float, device: torch.device, amp: str, peak_tflops: float | None) -> dict:
    """Achieved TFLOP/s at this rate of ``flops``-per-image images and, where the device's peak is known, the fraction of it.

    Without ``peak_tflops`` the peak is looked up in PEAK_TFLOPS, which holds tensor-core
    figures and so only applies under bf16 / fp16 autocast on CUDA.
    """
    achieved = flops * images_per_s / 1e12
    figures = {"gflop_per_image": round(flops / 1e9, 1), "achieved_tflops": round(achieved, 3)}
    peak = peak_tflops
    if peak is None and device.type == "cuda" and amp in ("bf16", "fp16"):
        name = torch.cuda.get_device_name(device)
        peak = next((value for part, value in PEAK_TFLOPS.items() if part in name), None)
    if peak:
        figures["fraction_of_peak"] = round(achieved / peak, 3)
    return figures


def environment() -> dict:
    """Date, versions, machine and the exact command: what a figure needs to be compared with another."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "crackseg": crackseg.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table, one column per key; list values (every window's rate) stay in the JSON only."""
    columns = list(dict.fromkeys(key for row in rows for key, value in row.items() if not isinstance(value, list)))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_report(rows: list[dict], out: Path) -> None:
    """Write the rows and the environment to ``out`` as JSON, and print the rows as a Markdown table."""
    report = {"environment": environment(), "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(rows))
    print(f"\n{json.dumps(report['environment'])}\nwritten to {out}")
