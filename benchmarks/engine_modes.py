"""bench.py's engines mode (docs/benchmarks.md: Ray against the local engine).

``crackseg predict`` over the same photos with ``--engine local`` (one process, torch's threads on every core) and
``--engine ray`` with 2 CPU actors (one thread each) on a Ray head started for the benchmark on this machine, the two
alternated within each round. Each window is a whole run: connecting to the cluster, the actors' start and model
loading included, as a survey pays them once per run.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from pathlib import Path

import torch

from crackseg.model.options import InferenceOptions
from crackseg.prediction.options import PredictOptions
from crackseg.prediction.predict import predict_folder
from harness import TESTS, median_rates, window_count
from prediction_modes import photos_and_model

sys.path.insert(0, str(TESTS))
from services import ray_head  # noqa: E402  (the suite's Ray head)

GOAL = 0.85  # the issue's: Ray's actors predict at least 0.85x as fast as the local engine on the same machine
ACTORS = 2


def bench_engines(args: argparse.Namespace) -> list[dict]:
    """Images/s of ``crackseg predict`` with the local engine and with Ray's actors, and their ratio."""
    size = args.size[0]
    count = 4 if args.quick else args.count
    windows = window_count(args, 5)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))  # as Ray clusters now run
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        photos, model = photos_and_model(args, tmp)
        inference = InferenceOptions(tile=max(size, 1024), batch_size=args.batch_size, device="cpu", amp=args.amp)
        with ray_head(dict(os.environ), ACTORS, tmp / "ray-head.log") as address:

            def window(engine: str) -> None:
                cluster = {"ray_address": address, "actors": ACTORS} if engine == "ray" else {}
                predict_folder(model, [str(photos)], PredictOptions(out=tmp / f"out-{engine}", inference=inference,
                               workers=args.workers, overwrite=True, engine=engine, **cluster))

            paths = {"--engine local": (lambda index: window("local"), count),
                     f"--engine ray, {ACTORS} CPU actors": (lambda index: window("ray"), count)}
            rates = median_rates(paths, windows, warmup=not args.quick)
    local = rates["--engine local"][0]
    common = {"encoder": args.encoder, "size": size, "images": count, "threads": torch.get_num_threads()}
    return [{"mode": "engines", "path": name, **common, "images_per_s": round(rate, 2), "vs_local": round(rate / local, 3),
             "goal_met": "" if name == "--engine local" else rate / local >= GOAL,
             "window_rates": [round(r, 2) for r in values]} for name, (rate, values) in rates.items()]
