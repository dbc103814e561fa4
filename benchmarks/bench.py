"""crackseg benchmarks: prints a Markdown table and writes JSON with the configuration and versions.

    python benchmarks/bench.py synth [--size 256] [--quick]
    python benchmarks/bench.py data [--size 448] [--crop-size 448] [--count 64] [--workers 0 1 2] [--quick]
    python benchmarks/bench.py evaluate [--size 448] [--count 1000] [--quick]

Each figure is the median over several timed windows after a warm-up window.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

import crackseg
from crackseg.data import CrackDataset, EpochSampler, make_loader, open_dataset
from crackseg.synth import parse_size, write_dataset
from crackseg.transforms import train_transform

RESULTS = Path(__file__).resolve().parent / "results"


def _median_rate(run_window, items_per_window: int, windows: int) -> tuple[float, list[float]]:
    """Images per second: one warm-up window, then the median of ``windows`` timed ones."""
    run_window(0)
    rates = []
    for index in range(1, windows + 1):
        start = time.perf_counter()
        run_window(index)
        rates.append(items_per_window / (time.perf_counter() - start))
    return statistics.median(rates), rates


def bench_synth(args: argparse.Namespace) -> list[dict]:
    """Synthetic data generation, files included (JPEG + PNG), in one process on one core."""
    torch.set_num_threads(1)
    per_window = 4 if args.quick else 16
    windows = 2 if args.quick else 5
    with tempfile.TemporaryDirectory() as tmp:

        def window(index: int) -> None:
            write_dataset(Path(tmp) / str(index), per_window, args.size, seed=index)

        rate, rates = _median_rate(window, per_window, windows)
    height, width = args.size
    return [{"mode": "synth", "size": f"{height}x{width}", "processes": 1, "images_per_s": round(rate, 1),
             "window_rates": [round(r, 1) for r in rates], "images_per_window": per_window}]


def bench_data(args: argparse.Namespace) -> list[dict]:
    """Dataset scan speed, and loader images/s by workers, with and without augmentation and cache."""
    count = 16 if args.quick else args.count
    epochs = 1 if args.quick else 3
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        write_dataset(root, count, args.size, seed=0, workers=os.cpu_count() or 1)
        open_dataset(root)  # warm the page cache: the figure is decoding and checking, not disk reads
        start = time.perf_counter()
        found = open_dataset(root)
        scan_rate = count / (time.perf_counter() - start)
        height, width = args.size
        rows.append({"mode": "data", "what": f"scan (decode + check), {os.cpu_count()} threads", "size": f"{height}x{width}",
                     "workers": "-", "images_per_s": round(scan_rate, 1), "per_worker": "-"})
        for augment in (False, True):
            for cache in (False, True):
                transform = train_transform(args.crop_size) if augment else None
                dataset = CrackDataset(found.samples, transform, seed=0, cache=cache)
                for workers in args.workers:
                    sampler = EpochSampler(torch.utils.data.RandomSampler(dataset))
                    loader = make_loader(dataset, 8, sampler, workers=workers)

                    def window(index: int) -> None:
                        sampler.set_epoch(index)
                        for _ in loader:
                            pass

                    rate, _ = _median_rate(window, len(dataset), epochs)
                    rows.append({"mode": "data", "what": ("augment" if augment else "decode only") + (" + cache" if cache else ""),
                                 "size": f"{height}x{width}", "workers": workers, "images_per_s": round(rate, 1),
                                 "per_worker": round(rate / max(workers, 1), 1)})
    return rows


def bench_evaluate(args: argparse.Namespace) -> list[dict]:
    """crackseg evaluate on saved 8-bit probability maps: whole runs, files read included."""
    from PIL import Image

    from crackseg.evaluate import evaluate_files

    count = 50 if args.quick else args.count
    height, width = args.size
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pred, gt = Path(tmp) / "pred", Path(tmp) / "gt"
        pred.mkdir()
        gt.mkdir()
        for index in range(count):
            truth = np.zeros((height, width), np.uint8)
            truth[rng.integers(0, height), :] = 255
            truth[:, rng.integers(0, width)] = 255
            prob = np.clip(rng.random((height, width)) * 120 + truth * 0.5, 0, 255).astype(np.uint8)
            Image.fromarray(truth).save(gt / f"{index:05d}.png")
            Image.fromarray(prob).save(pred / f"{index:05d}.png")
        for tolerance in (0.0, 2.0):
            evaluate_files(pred, gt, tolerance=tolerance)  # warm-up: page cache, thread pool
            start = time.perf_counter()
            evaluate_files(pred, gt, tolerance=tolerance)
            seconds = time.perf_counter() - start
            rows.append({"mode": "evaluate", "size": f"{height}x{width}", "images": count, "tolerance_px": tolerance,
                         "seconds": round(seconds, 2), "images_per_s": round(count / seconds, 1)})
    return rows


def _environment() -> dict:
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


def _markdown(rows: list[dict]) -> str:
    columns = [key for key in rows[0] if not isinstance(rows[0][key], list)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["synth", "data", "evaluate"])
    parser.add_argument("--size", type=parse_size, default=(256, 256), help="image size in px: N or HxW")
    parser.add_argument("--crop-size", type=int, default=448, help="training crop in px (data)")
    parser.add_argument("--count", type=int, default=None, help="images generated (default 64 for data, 1000 for evaluate)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="loader worker counts to try (data)")
    parser.add_argument("--quick", action="store_true", help="few, short windows: a smoke test, not a figure")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/MODE.json)")
    args = parser.parse_args()
    args.count = args.count or {"data": 64, "evaluate": 1000}.get(args.mode, 64)

    rows = {"synth": bench_synth, "data": bench_data, "evaluate": bench_evaluate}[args.mode](args)
    report = {"environment": _environment(), "rows": rows}
    out = args.out or RESULTS / f"{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(_markdown(rows))
    print(f"\n{json.dumps(report['environment'])}\nwritten to {out}")


if __name__ == "__main__":
    main()
