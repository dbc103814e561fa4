"""bench.py's training modes (docs/benchmarks.md: training throughput, training strategies).

train compares model-only throughput (tensors already on the device) with end-to-end
throughput from image files, counts FLOPs per image (forward and backward), and times each
stage of a training step's input on its own (one process, one core for the CPU stages).
strategies runs real ``crackseg train`` jobs under ``launch.sh``, one per strategy.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from crackseg.data.datasets import open_dataset
from crackseg.data.images import load_image, load_mask
from crackseg.data.pairing import Sample

from crackseg.data.synth import write_dataset
from crackseg.model.distributed import resolve_amp
from crackseg.training.loader import CrackDataset, EpochSampler, make_loader
from crackseg.training.transforms import DeviceGeometry, PhotometricJitter, train_transform, window_transform
from harness import compute_figures, device_sync, flops_per_image, median_rates, peak_memory_mb, window_count


def bench_train(args: argparse.Namespace) -> list[dict]:
    """Training images/s: the real train_one_epoch fed device tensors, then fed the real loader."""
    from crackseg.model import distributed
    from crackseg.training.losses import CrackLoss
    from crackseg.model.networks import build_model
    from crackseg.training.engine import StepContext, train_one_epoch

    device = torch.device(args.device)
    size = args.size[0]
    steps = 3 if args.quick else 10
    windows = window_count(args, 5)
    torch.manual_seed(0)
    model = build_model(args.encoder).to(device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    env = distributed.Environment(0, 0, 1, device)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    model_only = StepContext(env=env, loss_fn=CrackLoss(20.0), amp_dtype=resolve_amp(args.amp, device), scaler=scaler,
                             channels_last=args.channels_last, log_every=10**9)
    on_gpu = device.type == "cuda"  # where train scales, flips and turns on the device (--augment-on auto)
    geometry = DeviceGeometry(size) if on_gpu else None
    end_to_end = dataclasses.replace(model_only, jitter=PhotometricJitter(), geometry=geometry)
    in_workers = dataclasses.replace(end_to_end, geometry=None)
    flops = flops_per_image(model, size, device, train=True)
    images = torch.randint(0, 256, (args.batch_size, 3, size, size), dtype=torch.uint8, device=device)
    masks = (torch.rand(args.batch_size, 1, size, size, device=device) < 0.02).to(torch.uint8)
    on_device = [(images, masks)] * steps

    def model_window(index: int) -> None:
        train_one_epoch(model, on_device, optimizer, scheduler, model_only)
        device_sync(device)

    with tempfile.TemporaryDirectory() as tmp:
        count = steps * args.batch_size
        write_dataset(Path(tmp), count, (round(size * 1.25), round(size * 1.25)), seed=0, workers=os.cpu_count() or 1)
        samples = open_dataset(Path(tmp)).samples

        def loader_window(transform, context):
            dataset = CrackDataset(samples, transform, seed=0)
            sampler = EpochSampler(torch.utils.data.RandomSampler(dataset))
            loader = make_loader(dataset, args.batch_size, sampler, args.workers, on_gpu, drop_last=True)

            def window(index: int) -> None:
                sampler.set_epoch(index)
                train_one_epoch(model, loader, optimizer, scheduler, context)
                device_sync(device)
            return window, count // args.batch_size * args.batch_size

        rates = median_rates({"model": (model_window, steps * args.batch_size),
                              "end": loader_window(window_transform(size) if on_gpu else train_transform(size), end_to_end),
                              **({"workers": loader_window(train_transform(size), in_workers)} if on_gpu else {})}, windows)
        stages = _stage_costs(samples, window_transform(size) if on_gpu else train_transform(size), geometry, args.batch_size,
                              device, args.channels_last)
    model_rate, end_rate = rates["model"][0], rates["end"][0]
    stages["step (forward, backward, update)"] = 1 / model_rate
    common = {"encoder": args.encoder, "size": size, "batch": args.batch_size, "amp": args.amp,
              "channels_last": args.channels_last, "peak_memory_mb": peak_memory_mb(device)}
    return [
        {"mode": "train", "path": "model only (tensors on the device)", **common, "workers": "-", "images_per_s": round(model_rate, 2),
         **compute_figures(flops, model_rate, device, args.amp, args.peak_tflops)},
        {"mode": "train", "path": "end to end (files, augmentation, loader)", **common, "workers": args.workers,
         "images_per_s": round(end_rate, 2), "efficiency": round(end_rate / model_rate, 3),
         **compute_figures(flops, end_rate, device, args.amp, args.peak_tflops)},
        *([{"mode": "train", "path": "end to end, crops, flips and turns in the loader workers (--augment-on workers)", **common,
            "workers": args.workers, "images_per_s": round(rates["workers"][0], 2),
            "efficiency": round(rates["workers"][0] / model_rate, 3)}] if "workers" in rates else []),
        *({"mode": "train stages", "path": f"stage: {stage}", **common, "ms_per_image": round(seconds * 1e3, 3),
           "share_of_stages": round(seconds / sum(stages.values()), 3)} for stage, seconds in stages.items()),
    ]


def _stage_costs(samples: list[Sample], transform, geometry: DeviceGeometry | None, batch_size: int, device: torch.device,
                 channels_last: bool) -> dict[str, float]:
    """Seconds per image of each stage of a training step's input, each timed alone over ``samples`` in one process
    (after one untimed pass): where an image's time goes, whichever stages the loader's workers overlap."""
    jitter = PhotometricJitter()
    spent: dict[str, float] = {}

    def timed(stage: str, work, *args):
        start = time.perf_counter()
        result = work(*args)
        if stage in ("copy to device", "crop, flips, turns (on the device)", "photometric jitter (on the device)"):
            device_sync(device)
        spent[stage] = spent.get(stage, 0.0) + time.perf_counter() - start
        return result

    for _ in range(2):  # the first pass warms up, and is forgotten
        spent.clear()
        for first in range(0, len(samples), batch_size):
            pairs = []
            for sample in samples[first:first + batch_size]:
                data = timed("read", lambda: (sample.image.read_bytes(), sample.mask.read_bytes()))
                image = timed("decode image", load_image, io.BytesIO(data[0]))
                mask = timed("decode mask", load_mask, io.BytesIO(data[1]))
                pairs.append(timed("augment (window)" if geometry else "augment (crop, flips, turns)", transform, image, mask))
            images, masks = timed("collate", lambda: (torch.stack([image for image, _ in pairs]), torch.stack([mask for _, mask in pairs])))
            if device.type == "cuda":
                images, masks = images.pin_memory(), masks.pin_memory()
            images, masks = timed("copy to device", lambda: (images.to(device, non_blocking=True), masks.to(device, non_blocking=True)))
            if geometry is not None:
                images, masks = timed("crop, flips, turns (on the device)", geometry, images, masks)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            timed("photometric jitter (on the device)", jitter, images)
    return {stage: seconds / len(samples) for stage, seconds in spent.items()}


def bench_strategies(args: argparse.Namespace) -> list[dict]:
    """Training images/s and peak memory per strategy, from real `crackseg train` runs."""
    cuda = args.device.startswith("cuda")
    counts = list(range(2, (torch.cuda.device_count() if cuda else os.cpu_count() or 1) + 1))
    ddp = counts[-1] if counts else None
    plans = [("single process", 1, [])]
    if cuda and torch.cuda.device_count() > 1:
        plans.append(("DataParallel", 1, ["--strategy", "dp"]))
    plans += [(f"DDP x{n}", n, []) for n in counts]
    if ddp:
        amps = ["bf16", "fp16"] if cuda else ["bf16"]  # fp16 autocast with GradScaler needs a GPU
        plans += [(f"DDP x{ddp} + {amp}", ddp, ["--amp", amp]) for amp in amps]
        best_amp = ["--amp", "bf16"]
        plans.append((f"DDP x{ddp} + bf16 + channels_last", ddp, [*best_amp, "--channels-last"]))
        if not args.quick:
            plans.append((f"DDP x{ddp} + bf16 + channels_last + compile", ddp, [*best_amp, "--channels-last", "--compile"]))
        plans.append((f"DDP x{ddp} + bf16 + activation checkpointing", ddp, [*best_amp, "--activation-checkpointing"]))
    if args.quick:  # a smoke test of the machinery: the last plan, DDP with every flag that changes the log where there is DDP
        plans = plans[-1:]
    count = 8 if args.quick else 48
    size = args.size[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        write_dataset(data, count, (round(size * 1.25),) * 2, seed=0, workers=os.cpu_count() or 1)
        for index, (name, processes, flags) in enumerate(plans):
            run = Path(tmp) / f"run{index}"
            command = [
                "bash", str(Path(__file__).resolve().parents[1] / "launch.sh"), "--nproc", str(processes), "--max-restarts", "0",
                "train", "--data", str(data), "--run", str(run), "--epochs", "2", "--encoder", args.encoder,
                "--encoder-weights", "none", "--crop-size", str(size), "--batch-size", str(args.batch_size),
                "--workers", str(args.workers), "--device", args.device, "--val-fraction", "0.1",
                *([] if "--amp" in flags else ["--amp", "off"]), *([] if "--compile" in flags else ["--no-compile"]), *flags,
            ]
            env = {**os.environ, "PYTHON": sys.executable}
            for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(key, None)
            output = Path(tmp) / f"run{index}.out"
            with open(output, "w") as sink:
                process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
                # wait4 gives this run's own peak RSS: Linux folds reaped descendants (the workers) into it.
                _, status, usage = os.wait4(process.pid, 0)
                process.returncode = os.waitstatus_to_exitcode(status)
            if process.returncode != 0:
                raise SystemExit(f"{name} failed:\n{output.read_text()[-4000:]}")
            log = (run / "train.log").read_text()
            last = [line for line in log.splitlines() if "epoch 2/2" in line][-1]
            rate = float(re.search(r"([0-9.]+) img/s", last).group(1))
            gpu = re.search(r"peak GPU memory ([0-9.]+) GB", last)
            rows.append({
                "mode": "strategies", "strategy": name, "processes": processes, "encoder": args.encoder, "size": size,
                "batch_per_process": args.batch_size, "images_per_s": rate,
                "peak_memory": f"{gpu.group(1)} GB GPU" if gpu else f"{round(usage.ru_maxrss / 1024)} MB RSS (largest process)",
            })
    return rows
