"""crackseg benchmarks: prints a Markdown table and writes JSON with the configuration and versions.

    python benchmarks/bench.py synth [--size 256] [--quick]
    python benchmarks/bench.py data [--size 448] [--crop-size 448] [--count 64] [--workers 0 1 2] [--quick]
    python benchmarks/bench.py evaluate [--size 448] [--count 1000] [--quick]
    python benchmarks/bench.py train [--device cpu|cuda] [--encoder resnet34] [--size 448] [--batch-size 8]
                                     [--workers 4] [--amp bf16] [--channels-last] [--quick]
    python benchmarks/bench.py predict [--device ...] [--encoder ...] [--size 448] [--batch-size 8] [--count 64] [--quick]

    python benchmarks/bench.py strategies [--device cpu|cuda] [--encoder resnet18] [--size 256] [--batch-size 4] [--quick]
    python benchmarks/bench.py runtimes [--encoder resnet34] [--images DIR] [--count 40] [--quick]

    python benchmarks/bench.py rasters [--quick]

    python benchmarks/bench.py cracks --checkpoint checkpoints/demo/best.pt --data data/demo-test-truth

rasters predicts synthetic GeoTIFFs of 100 megapixels and 1 gigapixel by windows (peak RSS,
megapixels/s) beside a photo decoded whole.
cracks counts true cracks found as exactly one crack (synthetic data with per-crack truth),
before and after joining pieces; an accuracy figure, recorded in docs/results.md.
runtimes compares CPU prediction by torch (eager, channels_last, bf16), ONNX Runtime and
OpenVINO (f32, bf16) (model alone, and crackseg predict --no-measure from files), and the naive loop.

strategies runs real `crackseg train` jobs (one process, DataParallel, DDP for every process
count the machine allows, DDP + bf16 / fp16 AMP, + channels_last, + compile, + activation
checkpointing) for 2 epochs each and reports the second epoch's images/s from the run's log.
On CPU the DDP processes are gloo processes sharing the cores.

train and predict compare model-only throughput (tensors already on the device) with
end-to-end throughput from image files; their ratio is the input pipeline's efficiency.
They also count the model's FLOPs per image (torch.utils.flop_counter; training counts
forward and backward) and report the achieved TFLOP/s, and the fraction of the device's
peak where it is known (--peak-tflops gives it for other devices).
data times the loader's decoding and geometric augmentation by worker count, and the
photometric jitter that the training step runs on the device.

Each figure is the median over several timed windows after a warm-up window (--windows sets
how many; on a machine whose speed drifts, more).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
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
from crackseg.distributed import resolve_amp
from crackseg.predict import default_workers
from crackseg.synth import parse_size, write_dataset
from crackseg.transforms import PhotometricJitter, train_transform

RESULTS = Path(__file__).resolve().parent / "results"


def _median_rates(paths: dict, windows: int) -> dict:
    """Images per second of each path {name: (run_window, items per window)}: a warm-up round, then the median of ``windows`` rounds.

    Every round runs each path once in turn, so a shared machine's slow drifts (clock,
    neighbours, warming caches) hit all paths alike instead of whichever ran first.
    """
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for index in range(windows + 1):
        for name, (run_window, items) in paths.items():
            start = time.perf_counter()
            run_window(index)
            if index:
                rates[name].append(items / (time.perf_counter() - start))
    return {name: (statistics.median(values), values) for name, values in rates.items()}


def _windows(args: argparse.Namespace, default: int) -> int:
    """Timed windows after the warm-up: --windows, else the mode's default, else 1 with --quick."""
    return args.windows or (1 if args.quick else default)


def _median_rate(run_window, items_per_window: int, windows: int) -> tuple[float, list[float]]:
    return _median_rates({"": (run_window, items_per_window)}, windows)[""]


def bench_synth(args: argparse.Namespace) -> list[dict]:
    """Synthetic data generation, files included (JPEG + PNG), in one process on one core."""
    torch.set_num_threads(1)
    per_window = 4 if args.quick else 16
    windows = _windows(args, 5)
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
    epochs = _windows(args, 3)
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

                    def window(index: int, sampler=sampler, loader=loader) -> None:
                        sampler.set_epoch(index)
                        for _ in loader:
                            pass

                    rate, _ = _median_rate(window, len(dataset), epochs)
                    rows.append({"mode": "data", "what": ("geometric augmentation" if augment else "decode only") + (" + cache" if cache else ""),
                                 "size": f"{height}x{width}", "workers": workers, "images_per_s": round(rate, 1),
                                 "per_worker": round(rate / max(workers, 1), 1)})
    device = torch.device(args.device)
    batch = torch.randint(0, 256, (8, 3, args.crop_size, args.crop_size), dtype=torch.uint8, device=device)
    jitter = PhotometricJitter()

    def jitter_window(index: int) -> None:
        for _ in range(2 if args.quick else 10):
            jitter(batch)
        _device_sync(device)

    rate, _ = _median_rate(jitter_window, (2 if args.quick else 10) * 8, _windows(args, 5))
    rows.append({"mode": "data", "what": f"photometric jitter on {device.type}, batches of 8 (training step, not loader)",
                 "size": f"{args.crop_size}x{args.crop_size}", "workers": "-", "images_per_s": round(rate, 1), "per_worker": "-"})
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


def _device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # process RSS, KiB on Linux


# Dense bf16 / fp16 tensor-core peaks from NVIDIA's datasheets, by a part of the device name.
PEAK_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.5, "H100 NVL": 835.5, "H200": 989.4, "A100": 312.0}


def _flops_per_image(model: torch.nn.Module, size: int, device: torch.device, train: bool) -> int:
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


def _compute(flops_per_image: int, images_per_s: float, device: torch.device, args: argparse.Namespace) -> dict:
    """Achieved TFLOP/s at this rate and, where the device's peak is known, the fraction of it."""
    achieved = flops_per_image * images_per_s / 1e12
    figures = {"gflop_per_image": round(flops_per_image / 1e9, 1), "achieved_tflops": round(achieved, 3)}
    peak = args.peak_tflops
    if peak is None and device.type == "cuda" and args.amp in ("bf16", "fp16"):
        name = torch.cuda.get_device_name(device)
        peak = next((value for part, value in PEAK_TFLOPS.items() if part in name), None)
    if peak:
        figures["fraction_of_peak"] = round(achieved / peak, 3)
    return figures


def bench_train(args: argparse.Namespace) -> list[dict]:
    """Training images/s: the real train_one_epoch fed device tensors, then fed the real loader."""
    from crackseg import distributed
    from crackseg.losses import CrackLoss
    from crackseg.models import build_model
    from crackseg.engine import StepContext, train_one_epoch

    device = torch.device(args.device)
    size = args.size[0]
    steps = 3 if args.quick else 10
    windows = _windows(args, 5)
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
    end_to_end = dataclasses.replace(model_only, jitter=PhotometricJitter())
    flops = _flops_per_image(model, size, device, train=True)
    images = torch.randint(0, 256, (args.batch_size, 3, size, size), dtype=torch.uint8, device=device)
    masks = (torch.rand(args.batch_size, 1, size, size, device=device) < 0.02).to(torch.uint8)
    on_device = [(images, masks)] * steps

    def model_window(index: int) -> None:
        train_one_epoch(model, on_device, optimizer, scheduler, model_only)
        _device_sync(device)

    with tempfile.TemporaryDirectory() as tmp:
        count = steps * args.batch_size
        write_dataset(Path(tmp), count, (round(size * 1.25), round(size * 1.25)), seed=0, workers=os.cpu_count() or 1)
        dataset = CrackDataset(open_dataset(Path(tmp)).samples, train_transform(size), seed=0)
        sampler = EpochSampler(torch.utils.data.RandomSampler(dataset))
        loader = make_loader(dataset, args.batch_size, sampler, args.workers, device.type == "cuda", drop_last=True)

        def loader_window(index: int) -> None:
            sampler.set_epoch(index)
            train_one_epoch(model, loader, optimizer, scheduler, end_to_end)
            _device_sync(device)

        rates = _median_rates({"model": (model_window, steps * args.batch_size),
                               "end": (loader_window, count // args.batch_size * args.batch_size)}, windows)
    model_rate, end_rate = rates["model"][0], rates["end"][0]
    common = {"encoder": args.encoder, "size": size, "batch": args.batch_size, "amp": args.amp,
              "channels_last": args.channels_last, "peak_memory_mb": _peak_memory_mb(device)}
    return [
        {"mode": "train", "path": "model only (tensors on the device)", **common, "workers": "-", "images_per_s": round(model_rate, 2),
         **_compute(flops, model_rate, device, args)},
        {"mode": "train", "path": "end to end (files, augmentation, loader)", **common, "workers": args.workers,
         "images_per_s": round(end_rate, 2), "efficiency": round(end_rate / model_rate, 3), **_compute(flops, end_rate, device, args)},
    ]


def bench_predict(args: argparse.Namespace) -> list[dict]:
    """Inference images/s: the model alone, crackseg predict from JPEG files to PNG masks, a naive loop."""
    from PIL import Image

    from crackseg.checkpoint import save_model
    from crackseg.models import build_model
    from crackseg.predict import PredictOptions, predict_folder

    device = torch.device(args.device)
    size = args.size[0]
    count = args.batch_size if args.quick else max(args.count, args.batch_size)
    windows = _windows(args, 3)
    torch.manual_seed(0)
    model = build_model(args.encoder).to(device).eval()
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    flops = _flops_per_image(model, size, device, train=False)
    batch = torch.randint(0, 256, (args.batch_size, 3, size, size), dtype=torch.uint8, device=device)
    if args.channels_last:
        batch = batch.contiguous(memory_format=torch.channels_last)

    amp_dtype = resolve_amp(args.amp, device)

    @torch.inference_mode()
    def model_window(index: int) -> None:
        for _ in range(count // args.batch_size):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                (torch.sigmoid(model(batch).float()) >= 0.5).to("cpu", non_blocking=True)
        _device_sync(device)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_dataset(Path(tmp) / "data", count, (size, size), seed=0, workers=os.cpu_count() or 1)
        model.threshold = _threshold_for_crack_fraction(model, Path(tmp) / "data" / "images", 0.02, device)
        save_model(model, Path(tmp) / "model.pt")
        options = dict(tile=max(size, 1024), batch_size=args.batch_size, workers=args.workers, device=args.device,
                       amp=args.amp, channels_last=args.channels_last, overwrite=True)

        def crackseg_window(index: int, measure: bool) -> None:
            predict_folder(Path(tmp) / "model.pt", [str(Path(tmp) / "data" / "images")],
                           PredictOptions(out=Path(tmp) / "out", measure=measure, **options))

        @torch.inference_mode()
        def naive_window(index: int) -> None:
            """The classic tool: one image per pass, fp32, no workers, everything resized to 448 px."""
            for path in sorted((Path(tmp) / "data" / "images").iterdir()):
                image = Image.open(path).convert("RGB")
                pixels = torch.from_numpy(np.array(image.resize((448, 448)))).permute(2, 0, 1)[None].to(device)
                prob = torch.sigmoid(model(pixels))[0, 0].cpu().numpy()
                mask = Image.fromarray(((prob > model.threshold) * 255).astype(np.uint8)).resize(image.size)
                mask.save(Path(tmp) / "naive.png")

        rates = _median_rates({
            "model": (model_window, count // args.batch_size * args.batch_size),
            True: (lambda index: crackseg_window(index, measure=True), count),
            False: (lambda index: crackseg_window(index, measure=False), count),
            "naive": (naive_window, count),
        }, windows)
    model_rate, naive_rate = rates["model"][0], rates["naive"][0]
    end_rates = {measure: rates[measure][0] for measure in (True, False)}
    common = {"encoder": args.encoder, "size": size, "batch": args.batch_size, "amp": args.amp, "channels_last": args.channels_last}
    rows.append({"mode": "predict", "path": "model only (forward + threshold)", **common, "images_per_s": round(model_rate, 2),
                 **_compute(flops, model_rate, device, args)})
    for measure, rate in end_rates.items():
        what = "JPEG files to PNG masks + measurements" if measure else "JPEG files to PNG masks (--no-measure)"
        rows.append({"mode": "predict", "path": f"crackseg predict, {what}, {args.workers} workers", **common,
                     "images_per_s": round(rate, 2), "efficiency": round(rate / model_rate, 3)})
    rows.append({"mode": "predict", "path": "naive loop (batch 1, fp32, resize to 448, no workers)", **common, "batch": 1, "amp": "off",
                 "images_per_s": round(naive_rate, 2), "crackseg_speedup": round(end_rates[False] / naive_rate, 2)})
    return rows


def bench_runtimes(args: argparse.Namespace) -> list[dict]:
    """CPU prediction by runtime: torch eager, channels_last and bf16, ONNX Runtime, OpenVINO in f32 and bf16, and the naive loop.

    Each runtime is timed twice: its model alone on decoded images in memory (one image per
    call, probabilities thresholded), and ``crackseg predict --no-measure`` from the image
    files to PNG masks. All paths alternate within each round. Masks are compared with
    torch eager's on every image, since bf16 changes the probabilities.
    """
    from PIL import Image

    from crackseg.checkpoint import save_model
    from crackseg.export import export_model, load_inference_model
    from crackseg.images import load_image
    from crackseg.models import build_model
    from crackseg.predict import PredictOptions, predict_folder

    windows = _windows(args, 3)
    torch.manual_seed(0)
    model = build_model(args.encoder).eval()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.images:
            source = Path(args.images)
            files = sorted(p for p in source.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[: args.count]
        else:
            write_dataset(tmp / "data", 4 if args.quick else args.count, args.size, seed=0)
            files = sorted((tmp / "data" / "images").iterdir())
        (tmp / "in").mkdir()
        for path in files:
            (tmp / "in" / path.name).symlink_to(path.resolve())
        model.threshold = _threshold_for_crack_fraction(model, tmp / "in", 0.02, torch.device("cpu"))
        save_model(model, tmp / "model.pt")
        export_model(tmp / "model.pt", "onnx", tmp / "model.onnx")
        export_model(tmp / "model.pt", "openvino", tmp / "model.xml")
        decoded = [load_image(path)[None] for path in files]
        height, width = decoded[0].shape[-2:]
        runtimes = {
            "torch eager": (tmp / "model.pt", dict(backend="torch", amp="off")),
            "torch channels_last": (tmp / "model.pt", dict(backend="torch", amp="off", channels_last=True)),
            "torch bf16": (tmp / "model.pt", dict(backend="torch", amp="bf16")),
            "onnxruntime": (tmp / "model.onnx", dict(backend="onnxruntime", amp="off")),
            "openvino": (tmp / "model.xml", dict(backend="openvino", amp="off")),
            "openvino bf16": (tmp / "model.xml", dict(backend="openvino", amp="bf16")),
        }
        paths, masks = {}, {}
        for name, (model_file, options) in runtimes.items():
            runner = load_inference_model(model_file, options["backend"], amp=options["amp"])
            if options.get("channels_last"):
                runner.to(memory_format=torch.channels_last)

            @torch.inference_mode()
            def model_only(index: int, runner=runner, options=options) -> list[np.ndarray]:
                found = []
                for image in decoded:
                    image = image.contiguous(memory_format=torch.channels_last) if options.get("channels_last") else image
                    with torch.autocast("cpu", torch.bfloat16, enabled=options["backend"] == "torch" and options["amp"] == "bf16"):
                        output = runner(image)
                    prob = output if getattr(runner, "returns_probabilities", False) else torch.sigmoid(output.float())
                    found.append((prob >= model.threshold).numpy())
                return found

            masks[name] = model_only(-1)

            def end_to_end(index: int, model_file=model_file, options=options, name=name) -> None:
                predict_folder(model_file, [str(tmp / "in")], PredictOptions(
                    out=tmp / "out" / name.replace(" ", "_"), measure=False, overwrite=True, workers=0, device="cpu", **options))

            paths[(name, "model")] = (model_only, len(files))
            paths[(name, "end")] = (end_to_end, len(files))

        @torch.inference_mode()
        def naive(index: int) -> None:
            """The classic tool: one image per pass, fp32 eager, every image resized to 448 px."""
            for path in files:
                image = Image.open(path).convert("RGB")
                pixels = torch.from_numpy(np.array(image.resize((448, 448)))).permute(2, 0, 1)[None]
                prob = torch.sigmoid(model(pixels))[0, 0].numpy()
                Image.fromarray(((prob > model.threshold) * 255).astype(np.uint8)).resize(image.size).save(tmp / "naive.png")

        paths["naive"] = (naive, len(files))
        rates = _median_rates(paths, windows)
    common = {"encoder": args.encoder, "images": len(files), "size": f"{width}x{height}", "source": "files" if args.images else "synthetic"}
    eager_end = rates[("torch eager", "end")][0]
    rows = []
    for name in runtimes:
        model_rate, end_rate = rates[(name, "model")][0], rates[(name, "end")][0]
        rows.append({"mode": "runtimes", "runtime": name, **common, "model_only_images_per_s": round(model_rate, 2),
                     "images_per_s": round(end_rate, 2), "efficiency": round(end_rate / model_rate, 3),
                     "vs_torch_eager_end_to_end": round(end_rate / eager_end, 2),
                     "mask_agreement_vs_torch_eager": round(float(np.mean([np.mean(a == b) for a, b in zip(masks[name], masks["torch eager"])])), 5),
                     "window_rates_end": [round(r, 2) for r in rates[(name, "end")][1]]})
    rows.append({"mode": "runtimes", "runtime": "naive loop (torch eager, resize to 448)", **common,
                 "images_per_s": round(rates["naive"][0], 2), "vs_torch_eager_end_to_end": round(rates["naive"][0] / eager_end, 2)})
    return rows


def bench_cracks(args: argparse.Namespace) -> list[dict]:
    """How many true cracks come out as exactly one crack, and their length error, per join setting.

    Needs ``--checkpoint`` and ``--data``, a folder written by ``crackseg synth --truth`` (its
    truth/<stem>.png labels each true crack). Each predicted crack is given to the true crack
    nearest to most of its pixels (within 3 px); predicted cracks near none are false cracks.
    Lengths are measured the same way on both sides (crackseg.measure on the true crack's pixels).
    """
    from PIL import Image
    from scipy import ndimage

    from crackseg.measure import find_cracks
    from crackseg.predict import PredictOptions, predict_folder

    settings = [("every connected piece (before)", "0px", "0px"), ("joined, specks dropped (defaults)", None, None)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pred"
        predict_folder(args.checkpoint, [str(args.data / "images")], PredictOptions(out=out, measure=False, device=args.device))
        stems = sorted(p.stem for p in (args.data / "truth").iterdir())
        for label, gap, shortest in settings:
            options = PredictOptions(out=out, **({"join_gap": gap, "min_length": shortest} if gap else {}))
            spec = options.output_spec()
            true_total = one = found = false = 0
            errors = []
            for stem in stems:
                truth = np.asarray(Image.open(args.data / "truth" / f"{stem}.png"))
                mask = np.asarray(Image.open(out / "masks" / f"{stem}.png")) > 127
                labels, cracks = find_cracks(mask, spec.join_gap_px, spec.min_length_px)
                distance, (near_y, near_x) = ndimage.distance_transform_edt(truth == 0, return_indices=True)
                nearest = np.where(distance <= 3, truth[near_y, near_x], 0)
                owner = {}
                for crack in cracks:
                    votes = np.bincount(nearest[labels == crack.id], minlength=256)
                    owner[crack.id] = int(votes[1:].argmax() + 1) if votes[1:].max() * 2 > votes.sum() else 0
                found += len(cracks)
                false += sum(value == 0 for value in owner.values())
                for true_id in np.unique(truth[truth > 0]):
                    true_length = sum(c.length_px for c in find_cracks(truth == true_id)[1])
                    pieces = [c for c in cracks if owner[c.id] == true_id]
                    true_total += 1
                    one += len(pieces) == 1
                    if pieces:
                        errors.append(sum(c.length_px for c in pieces) / true_length - 1)
            rows.append({"mode": "cracks", "setting": label, "join_gap_px": spec.join_gap_px, "min_length_px": spec.min_length_px,
                         "true_cracks": true_total, "found_cracks": found, "true_found_as_one": one,
                         "share_as_one": round(one / max(true_total, 1), 3), "false_cracks": false,
                         "median_length_error": round(float(np.median(errors)), 3) if errors else None,
                         "mean_abs_length_error": round(float(np.mean(np.abs(errors))), 3) if errors else None})
    return rows


_RASTER_CHILD = """
import json, sys, time
import onnxruntime, rasterio
import crackseg.predict
from crackseg.cli import main
start = time.perf_counter()
code = main(sys.argv[1:])
seconds = time.perf_counter() - start
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"code": code, "seconds": seconds, "peak_rss_mb": round(peak / 1024)}))
"""


def bench_rasters(args: argparse.Namespace) -> list[dict]:
    """Rasters predicted by windows: peak RSS and megapixels/s by raster size, beside the photo path.

    Each raster is a synthetic JPEG-compressed tiled GeoTIFF (512 px tiles, EPSG:32633, the
    way survey software writes orthomosaics), made in a temporary folder and deleted after.
    The model is a small CNN exported to ONNX, so the figures are those of the streaming
    (reading, blending, writing) rather than of a large model. Each run is a fresh
    ``crackseg predict --no-measure`` process, timed from after its imports (model loading
    included); its peak RSS is the kernel's VmHWM. The photo path predicts a 36-megapixel JPEG
    photo of the same texture, model and tile, decoded whole, right before each raster run:
    the median over --windows rounds (2 by default) of each.
    """
    import subprocess

    import rasterio
    from PIL import Image
    from affine import Affine
    from torch import nn

    from crackseg.export import write_exported
    from crackseg.models import CrackSegModel

    sides = [(1200, 1200)] if args.quick else [(10000, 10000), (32000, 32000)]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
    model = CrackSegModel(net, "unet", "small-cnn", size_divisor=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_exported(model, "onnx", tmp / "small.onnx")
        texture = _pavement_texture(512, 4096, seed=0)

        def predict(source: Path, out: Path) -> dict:
            command = [sys.executable, "-c", _RASTER_CHILD, "predict", str(source), "--model", str(tmp / "small.onnx"),
                       "--out", str(out), "--no-measure", "--threshold", "0.5", "--workers", "0"]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            return json.loads(result.stdout.strip().splitlines()[-1])

        photo_side = 600 if args.quick else 6000
        repeats = (photo_side // texture.shape[0] + 1, photo_side // texture.shape[1] + 1, 1)
        Image.fromarray(np.tile(texture, repeats)[:photo_side, :photo_side]).save(tmp / "photo.jpg", quality=90)
        with Image.open(tmp / "photo.jpg") as photo:  # megapixels as decoded, so a wrong size cannot inflate the rate
            inputs = {f"JPEG photo {photo.width}x{photo.height}, decoded whole": (tmp / "photo.jpg", photo.width * photo.height / 1e6)}
        for height, width in sides:
            path = tmp / f"ortho-{width}x{height}.tif"
            profile = dict(driver="GTiff", width=width, height=height, count=3, dtype="uint8", crs="EPSG:32633",
                           transform=Affine(0.005, 0.0, 500000.0, 0.0, -0.005, 5000000.0), tiled=True, blockxsize=512, blockysize=512,
                           compress="jpeg", photometric="ycbcr", jpeg_quality=90, bigtiff="if_safer")
            with rasterio.open(path, "w", **profile) as raster:
                for top in range(0, height, 512):
                    rows_here = min(512, height - top)
                    band = np.tile(texture, (1, width // texture.shape[1] + 1, 1))[:rows_here, :width]
                    raster.write(np.ascontiguousarray(band.transpose(2, 0, 1)), window=rasterio.windows.Window(0, top, width, rows_here))
            with rasterio.open(path) as raster:
                inputs[f"GeoTIFF {raster.width}x{raster.height}, JPEG tiles, read by windows"] = (path, raster.width * raster.height / 1e6)
        photo_name = next(iter(inputs))
        runs: dict[str, list[dict]] = {name: [] for name in inputs}
        for _ in range(_windows(args, 2)):  # each raster right after a photo run, so drift hits both alike
            for name, (path, _) in list(inputs.items())[1:]:
                runs[photo_name].append(predict(inputs[photo_name][0], tmp / "out"))
                shutil.rmtree(tmp / "out")
                runs[name].append(predict(path, tmp / "out"))
                shutil.rmtree(tmp / "out")
        photo_rate = statistics.median(inputs[photo_name][1] / run["seconds"] for run in runs[photo_name])
        for name, (_, megapixels) in inputs.items():
            rates = [megapixels / run["seconds"] for run in runs[name]]
            rows.append({"mode": "rasters", "input": name, "megapixels": megapixels, "runs": len(rates),
                         "megapixels_per_s": round(statistics.median(rates), 2), "vs_photo": round(statistics.median(rates) / photo_rate, 2),
                         "window_rates": [round(rate, 2) for rate in rates], "peak_rss_mb": max(run["peak_rss_mb"] for run in runs[name])})
    return rows


def _pavement_texture(height: int, width: int, seed: int) -> np.ndarray:
    """(H, W, 3) uint8 grey grain with a few dark lines: a stand-in for pavement that compresses like a photo."""
    rng = np.random.default_rng(seed)
    grain = rng.normal(180, 20, (height // 4, width // 4)).clip(0, 255)
    image = np.kron(grain, np.ones((4, 4)))
    image += rng.normal(0, 6, image.shape)
    for row in range(40, height, 170):
        image[row : row + 3, 100 : width - 100] = 40
    image = image.clip(0, 255).astype(np.uint8)
    return np.repeat(image[..., None], 3, axis=2)


@torch.inference_mode()
def _threshold_for_crack_fraction(model: torch.nn.Module, images: Path, fraction: float, device: torch.device) -> float:
    """A threshold that marks about ``fraction`` of the first image's pixels as crack.

    An untrained model at 0.5 marks most pixels, which makes the measurements several times
    dearer than on the sparse masks of a trained one; real crack photos are about 2% crack.
    """
    from crackseg.images import load_image

    first = load_image(sorted(images.iterdir())[0])[None].to(device)
    prob = torch.sigmoid(model(first).float()).flatten()
    return torch.quantile(prob[: 2**24], 1 - fraction).item()


def bench_strategies(args: argparse.Namespace) -> list[dict]:
    """Training images/s and peak memory per strategy, from real `crackseg train` runs."""
    import re
    import subprocess

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
    if args.quick:  # a smoke test of the machinery: one process, and DDP with every flag that changes the log
        plans = [plans[0], plans[-1]] if len(plans) > 1 else plans
    count = 16 if args.quick else 48
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
                *([] if "--amp" in flags else ["--amp", "off"]), *flags,
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
    columns = list(dict.fromkeys(key for row in rows for key, value in row.items() if not isinstance(value, list)))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["synth", "data", "evaluate", "train", "predict", "strategies", "runtimes", "cracks", "rasters"])
    parser.add_argument("--checkpoint", type=Path, default=None, help="cracks: the model whose predictions are counted")
    parser.add_argument("--data", type=Path, default=None, help="cracks: a folder written by crackseg synth --truth")
    parser.add_argument("--images", type=Path, default=None, help="runtimes: a folder of real photos to predict (default: synthetic)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda (data, train, predict)")
    parser.add_argument("--encoder", default="resnet34", help="smp encoder of the UNet (train, predict)")
    parser.add_argument("--batch-size", type=int, default=8, help="images per step (train, predict)")
    parser.add_argument("--amp", choices=["bf16", "fp16", "off"], default=None, help="mixed precision (default bf16 on CUDA, off on CPU)")
    parser.add_argument("--channels-last", action="store_true", help="NHWC layout (train, predict)")
    parser.add_argument("--size", type=parse_size, default=(256, 256), help="image size in px: N or HxW")
    parser.add_argument("--crop-size", type=int, default=448, help="training crop in px (data)")
    parser.add_argument("--count", type=int, default=None, help="images generated (default 1000 for evaluate, 64 otherwise; predict times whole runs over them)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="loader workers: counts to try (data, default 0 1 2) or one count (train, default 2; predict, default crackseg's: 0 on CPU)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOP/s at this precision, for the fraction of peak (known H100/H200/A100 bf16 peaks are built in)")
    parser.add_argument("--windows", type=int, default=None,
                        help="timed windows after the warm-up, median reported (default 5; data and predict 3): more on a noisy machine")
    parser.add_argument("--quick", action="store_true", help="few, short windows: a smoke test, not a figure")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/MODE.json)")
    args = parser.parse_args()
    args.count = args.count or {"data": 64, "evaluate": 1000}.get(args.mode, 64)
    if args.mode == "data":
        args.workers = args.workers or [0, 1, 2]
    elif args.mode == "predict":
        args.workers = args.workers[0] if args.workers else default_workers(torch.device(args.device))
    else:
        args.workers = (args.workers or [2])[0]
    args.amp = args.amp or ("bf16" if args.device.startswith("cuda") else "off")

    modes = {"synth": bench_synth, "data": bench_data, "evaluate": bench_evaluate, "train": bench_train, "predict": bench_predict,
             "strategies": bench_strategies, "runtimes": bench_runtimes, "cracks": bench_cracks,
             "rasters": bench_rasters}
    rows = modes[args.mode](args)
    report = {"environment": _environment(), "rows": rows}
    out = args.out or RESULTS / f"{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(_markdown(rows))
    print(f"\n{json.dumps(report['environment'])}\nwritten to {out}")


if __name__ == "__main__":
    main()
