"""bench.py's modes without a model (docs/benchmarks.md: synthetic data, data loading, evaluation).

synth times writing synthetic samples; data times the dataset scan, the loader's decoding and
geometric augmentation by worker count, and the photometric jitter that the training step
runs on the device; evaluate times whole ``crackseg evaluate`` runs over saved maps.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from crackseg.data.datasets import open_dataset

from crackseg.training.image_cache import decoded_samples
from crackseg.training.loader import CrackDataset, EpochSampler, make_loader
from crackseg.data.synth import write_dataset
from crackseg.training.transforms import PhotometricJitter, train_transform
from harness import device_sync, median_rate, window_count


def bench_synth(args: argparse.Namespace) -> list[dict]:
    """Synthetic data generation, files included (JPEG + PNG), in one process on one core."""
    torch.set_num_threads(1)
    per_window = 4 if args.quick else 16
    windows = window_count(args, 5)
    with tempfile.TemporaryDirectory() as tmp:

        def window(index: int) -> None:
            write_dataset(Path(tmp) / str(index), per_window, args.size, seed=index)

        rate, rates = median_rate(window, per_window, windows)
    height, width = args.size
    return [{"mode": "synth", "size": f"{height}x{width}", "processes": 1, "images_per_s": round(rate, 1),
             "window_rates": [round(r, 1) for r in rates], "images_per_window": per_window}]


def bench_data(args: argparse.Namespace) -> list[dict]:
    """Dataset scan speed, and loader images/s by workers, with and without augmentation and cache."""
    count = 16 if args.quick else args.count
    epochs = window_count(args, 3)
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
                dataset = CrackDataset(found.samples, transform, seed=0, cached=decoded_samples(found.samples) if cache else None)
                for workers in args.workers:
                    sampler = EpochSampler(torch.utils.data.RandomSampler(dataset))
                    loader = make_loader(dataset, 8, sampler, workers=workers)

                    def window(index: int, sampler=sampler, loader=loader) -> None:
                        sampler.set_epoch(index)
                        for _ in loader:
                            pass

                    rate, _ = median_rate(window, len(dataset), epochs)
                    rows.append({"mode": "data", "what": ("geometric augmentation" if augment else "decode only") + (" + cache" if cache else ""),
                                 "size": f"{height}x{width}", "workers": workers, "images_per_s": round(rate, 1),
                                 "per_worker": round(rate / max(workers, 1), 1)})
    device = torch.device(args.device)
    batch = torch.randint(0, 256, (8, 3, args.crop_size, args.crop_size), dtype=torch.uint8, device=device)
    jitter = PhotometricJitter()

    def jitter_window(index: int) -> None:
        for _ in range(2 if args.quick else 10):
            jitter(batch)
        device_sync(device)

    rate, _ = median_rate(jitter_window, (2 if args.quick else 10) * 8, window_count(args, 5))
    rows.append({"mode": "data", "what": f"photometric jitter on {device.type}, batches of 8 (training step, not loader)",
                 "size": f"{args.crop_size}x{args.crop_size}", "workers": "-", "images_per_s": round(rate, 1), "per_worker": "-"})
    return rows


def bench_evaluate(args: argparse.Namespace) -> list[dict]:
    """crackseg evaluate on saved 8-bit probability maps: whole runs, files read included."""
    from PIL import Image

    from crackseg.evaluation.evaluate import evaluate_files

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
