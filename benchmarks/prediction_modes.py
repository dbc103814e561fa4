"""bench.py's prediction modes (docs/benchmarks.md: prediction throughput, CPU runtimes).

predict compares the model alone (tensors on the device) with ``crackseg predict`` from
image files and with the classic tool's naive loop, counts FLOPs per image, and times each stage
of the files-to-outputs path on its own (one process, one core for the CPU stages). runtimes
does the same on the CPU for torch (eager, channels_last, bf16), ONNX Runtime and OpenVINO
(f32, bf16). The untrained models' threshold is set to mark about 2% of the pixels as crack.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.core.files import write_atomic
from crackseg.cracks.measure import find_cracks
from crackseg.cracks.options import JOIN_GAP, MIN_LENGTH
from crackseg.data.images import crack_mask, load_image
from crackseg.data.synth import write_dataset
from crackseg.model.checkpoint import save_model
from crackseg.model.distributed import resolve_amp
from crackseg.model.networks import build_model
from crackseg.model.options import InferenceOptions
from crackseg.prediction.decoding import decode_batch
from crackseg.prediction.options import PredictOptions
from crackseg.prediction.predict import predict_folder
from skimage.morphology import skeletonize, thin

from harness import compute_figures, device_sync, flops_per_image, median_rates, window_count


def photos_and_model(args: argparse.Namespace, folder: Path) -> tuple[Path, Path]:
    """``args.count`` synthetic photos of ``args.size`` (4 with --quick) and an untrained UNet of ``args.encoder`` whose
    threshold marks about 2% of their pixels, written in ``folder``: (the photos' folder, the model file)."""
    size = args.size[0]
    torch.manual_seed(0)
    model = build_model(args.encoder).eval()
    write_dataset(folder / "data", 4 if args.quick else args.count, (size, size), seed=0, workers=os.cpu_count() or 1)
    photos = folder / "data" / "images"
    model.threshold = _threshold_for_crack_fraction(model, photos, 0.02, torch.device("cpu"))
    save_model(model, folder / "model.pt")
    return photos, folder / "model.pt"


@torch.inference_mode()
def _threshold_for_crack_fraction(model: torch.nn.Module, images: Path, fraction: float, device: torch.device,
                                  sample: int = 8) -> float:
    """A threshold that marks about ``fraction`` of the pixels of the first ``sample`` images as crack.

    An untrained model at 0.5 marks most pixels, which makes the measurements several times
    dearer than on the sparse masks of a trained one; real crack photos are about 2% crack.
    One image's threshold left others of the same synthetic set at 12 to 18%.
    """
    probs = [torch.sigmoid(model(load_image(path)[None].to(device)).float()).flatten()
             for path in sorted(images.iterdir())[:sample]]
    prob = torch.cat(probs)
    return torch.quantile(prob[torch.randperm(len(prob), generator=torch.Generator().manual_seed(0))[: 2**24].to(prob.device)],
                          1 - fraction).item()


@torch.inference_mode()
def _naive_loop(model: torch.nn.Module, files: list[Path], device: torch.device, mask_file: Path) -> None:
    """The classic tool: one image per pass, fp32, no workers, every image resized to 448 px, masks only."""
    for path in files:
        image = Image.open(path).convert("RGB")
        pixels = torch.from_numpy(np.array(image.resize((448, 448)))).permute(2, 0, 1)[None].to(device)
        prob = torch.sigmoid(model(pixels))[0, 0].cpu().numpy()
        Image.fromarray(((prob > model.threshold) * 255).astype(np.uint8)).resize(image.size).save(mask_file)


def bench_predict(args: argparse.Namespace) -> list[dict]:
    """Inference images/s: the model alone, crackseg predict from JPEG files to PNG masks, a naive loop."""
    device = torch.device(args.device)
    size = args.size[0]
    count = args.batch_size if args.quick else max(args.count, args.batch_size)
    windows = window_count(args, 3)
    torch.manual_seed(0)
    model = build_model(args.encoder).to(device).eval()
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    flops = flops_per_image(model, size, device, train=False)
    batch = torch.randint(0, 256, (args.batch_size, 3, size, size), dtype=torch.uint8, device=device)
    if args.channels_last:
        batch = batch.contiguous(memory_format=torch.channels_last)

    amp_dtype = resolve_amp(args.amp, device)

    @torch.inference_mode()
    def model_window(index: int) -> None:
        for _ in range(count // args.batch_size):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                (torch.sigmoid(model(batch).float()) >= 0.5).to("cpu", non_blocking=True)
        device_sync(device)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_dataset(Path(tmp) / "data", count, (size, size), seed=0, workers=os.cpu_count() or 1)
        model.threshold = _threshold_for_crack_fraction(model, Path(tmp) / "data" / "images", 0.02, device)
        save_model(model, Path(tmp) / "model.pt")
        inference = InferenceOptions(tile=max(size, 1024), batch_size=args.batch_size, device=args.device, amp=args.amp,
                                     channels_last=args.channels_last)

        def crackseg_window(index: int, measure: bool, decode: str = "auto") -> None:
            predict_folder(Path(tmp) / "model.pt", [str(Path(tmp) / "data" / "images")],
                           PredictOptions(out=Path(tmp) / "out", inference=inference, measure=measure, workers=args.workers,
                                          overwrite=True, decode=decode))
        files = sorted((Path(tmp) / "data" / "images").iterdir())
        for timed_files in (files[:args.batch_size], files):  # the first batch warms up (numba's compiled code is loaded)
            stages = _stage_costs(timed_files, model, device, amp_dtype, args.batch_size, args.channels_last, Path(tmp) / "stages")

        rates = median_rates({
            "model": (model_window, count // args.batch_size * args.batch_size),
            True: (lambda index: crackseg_window(index, measure=True), count),
            False: (lambda index: crackseg_window(index, measure=False), count),
            "naive": (lambda index: _naive_loop(model, files, device, Path(tmp) / "naive.png"), count),
            **({"workers decode": (lambda index: crackseg_window(index, measure=False, decode="workers"), count)}
               if device.type == "cuda" else {}),  # JPEGs decoded by Pillow in the workers, as on the CPU
        }, windows)
    model_rate, naive_rate = rates["model"][0], rates["naive"][0]
    end_rates = {measure: rates[measure][0] for measure in (True, False)}
    common = {"encoder": args.encoder, "size": size, "batch": args.batch_size, "amp": args.amp, "channels_last": args.channels_last}
    rows.append({"mode": "predict", "path": "model only (forward + threshold)", **common, "images_per_s": round(model_rate, 2),
                 **compute_figures(flops, model_rate, device, args.amp, args.peak_tflops)})
    # each round runs the two back to back, so their ratio within a round is spared the drift between rounds
    of_no_measure = statistics.median(kept / bare for kept, bare in zip(rates[True][1], rates[False][1]))
    for measure, rate in end_rates.items():
        what = "JPEG files to PNG masks + measurements" if measure else "JPEG files to PNG masks (--no-measure)"
        rows.append({"mode": "predict", "path": f"crackseg predict, {what}, {args.workers} workers", **common,
                     "images_per_s": round(rate, 2), "efficiency": round(rate / model_rate, 3),
                     **({"of_no_measure_paired": round(of_no_measure, 3)} if measure else {})})
    if "workers decode" in rates:
        rows.append({"mode": "predict", "path": f"crackseg predict, JPEG files to PNG masks (--no-measure --decode workers), "
                     f"{args.workers} workers", **common, "images_per_s": round(rates["workers decode"][0], 2),
                     "efficiency": round(rates["workers decode"][0] / model_rate, 3)})
    rows.append({"mode": "predict", "path": "naive loop (batch 1, fp32, resize to 448, no workers)", **common, "batch": 1, "amp": "off",
                 "images_per_s": round(naive_rate, 2), "crackseg_speedup": round(end_rates[False] / naive_rate, 2)})
    total = sum(stages.values())
    for stage, seconds in stages.items():
        rows.append({"mode": "predict stages", "path": f"stage: {stage}", **common, "ms_per_image": round(seconds * 1e3, 3),
                     "share_of_stages": round(seconds / total, 3)})
    return rows


def _png(mask: np.ndarray) -> bytes:
    """A mask as predict encodes it."""
    buffer = io.BytesIO()
    Image.fromarray(mask.astype(np.uint8) * 255).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


@torch.inference_mode()
def _stage_costs(files: list[Path], model: torch.nn.Module, device: torch.device, amp_dtype: torch.dtype | None,
                 batch_size: int, channels_last: bool, folder: Path) -> dict[str, float]:
    """Seconds per image of each stage of the files-to-outputs path, each timed alone over ``files`` in one process
    (the device stages per batch, synchronized): where an image's time goes, whichever stage a pipeline overlaps."""
    folder.mkdir(exist_ok=True)
    on_device = ["decode on the device (batch, nvJPEG)"] if device.type == "cuda" else []  # what predict does there
    spent = dict.fromkeys(["read", "decode", *on_device, "copy to device", "forward", "threshold", "copy back", "measure",
                           "encode PNG", "write"], 0.0)

    def timed(stage: str, work, *args):
        start = time.perf_counter()
        result = work(*args)
        if stage in ("copy to device", "forward", "threshold", "copy back", *on_device):
            device_sync(device)
        spent[stage] += time.perf_counter() - start
        return result

    for first in range(0, len(files), batch_size):
        batch = files[first:first + batch_size]
        data = [timed("read", Path.read_bytes, path) for path in batch]
        images = [timed("decode", load_image, io.BytesIO(item)) for item in data]
        for stage in on_device:
            timed(stage, decode_batch, [torch.frombuffer(bytearray(item), dtype=torch.uint8) for item in data], device)
        pixels = torch.stack(images).pin_memory() if device.type == "cuda" else torch.stack(images)
        pixels = timed("copy to device", lambda: pixels.to(device, non_blocking=True))
        if channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = timed("forward", model, pixels)
        masks = timed("threshold", lambda: torch.sigmoid(logits.float())[:, 0] >= model.threshold)  # where the model ran, as predict does
        for index, mask in enumerate(timed("copy back", masks.cpu).numpy()):
            timed("measure", find_cracks, mask, JOIN_GAP.value, MIN_LENGTH.value)
            encoded = timed("encode PNG", _png, mask)
            timed("write", write_atomic, folder / f"{first + index}.png", encoded)
    return {stage: seconds / len(files) for stage, seconds in spent.items()}


def bench_runtimes(args: argparse.Namespace) -> list[dict]:
    """CPU prediction by runtime: torch eager, channels_last and bf16, ONNX Runtime, OpenVINO in f32 and bf16, and the naive loop.

    Each runtime is timed three ways: its model alone on decoded images in memory (one image per
    call, probabilities thresholded), ``crackseg predict --no-measure`` from the image files to
    PNG masks, and the same on the first image alone: the run's fixed cost (loading and checking
    the model, the first call). The whole run less that one-image run gives the steady rate of
    a long survey, where loading is spread over many photos. All paths alternate within each
    round. Masks are compared with torch eager's on every image, since bf16 changes the
    probabilities.
    """
    from crackseg.model.export import export_model
    from crackseg.model.runtimes import choose_runtime, load_runtime
    from crackseg.data.images import load_image

    windows = window_count(args, 3)
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
        (tmp / "first").mkdir()
        for path in files:
            (tmp / "in" / path.name).symlink_to(path.resolve())
        (tmp / "first" / files[0].name).symlink_to(files[0].resolve())
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
        for name, (model_file, options) in list(runtimes.items()):
            inference = InferenceOptions(device="cpu", **options)
            try:
                runner = load_runtime(choose_runtime(model_file, inference)).model
            except InputError as error:  # bf16 on a CPU without it
                print(f"{name}: left out ({error})", file=sys.stderr)
                del runtimes[name]
                continue

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

            def end_to_end(index: int, folder: str = "in", model_file=model_file, inference=inference, name=name) -> None:
                predict_folder(model_file, [str(tmp / folder)], PredictOptions(
                    out=tmp / "out" / name.replace(" ", "_"), inference=inference, measure=False, overwrite=True, workers=0))

            paths[(name, "model")] = (model_only, len(files))
            paths[(name, "end")] = (end_to_end, len(files))
            paths[(name, "first")] = (functools.partial(end_to_end, folder="first"), 1)
        paths["naive"] = (lambda index: _naive_loop(model, files, torch.device("cpu"), tmp / "naive.png"), len(files))
        rates = median_rates(paths, windows)
    common = {"encoder": args.encoder, "images": len(files), "size": f"{width}x{height}", "source": "files" if args.images else "synthetic"}
    eager_end = rates[("torch eager", "end")][0]
    rows = []
    for name in runtimes:
        model_rate, end_rate = rates[(name, "model")][0], rates[(name, "end")][0]
        # each round's whole run less its one-image run: the other images' time, without the fixed cost
        steady = statistics.median((len(files) - 1) / (len(files) / whole - 1 / first)
                                   for whole, first in zip(rates[(name, "end")][1], rates[(name, "first")][1]))
        rows.append({"mode": "runtimes", "runtime": name, **common, "model_only_images_per_s": round(model_rate, 2),
                     "images_per_s": round(end_rate, 2), "efficiency": round(end_rate / model_rate, 3),
                     "fixed_cost_s": round(1 / rates[(name, "first")][0], 3), "steady_images_per_s": round(steady, 2),
                     "steady_efficiency": round(steady / model_rate, 3),
                     "vs_torch_eager_end_to_end": round(end_rate / eager_end, 2),
                     "mask_agreement_vs_torch_eager": round(float(np.mean([np.mean(a == b) for a, b in zip(masks[name], masks["torch eager"])])), 5),
                     "window_rates_end": [round(r, 2) for r in rates[(name, "end")][1]]})
    rows.append({"mode": "runtimes", "runtime": "naive loop (torch eager, resize to 448)", **common,
                 "images_per_s": round(rates["naive"][0], 2), "vs_torch_eager_end_to_end": round(rates["naive"][0] / eager_end, 2)})
    return rows


def bench_measure(args: argparse.Namespace) -> list[dict]:
    """find_cracks against one skimage skeletonize of the same masks, per folder: ms per mask and the ratio; skimage's
    thin, the thinning find_cracks reproduces, beside them."""
    windows = window_count(args, 5)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = args.masks
        if not folders:
            size = args.size[0]
            write_dataset(Path(tmp) / "data", 4 if args.quick else args.count, (size, size), seed=0, workers=os.cpu_count() or 1)
            folders = [Path(tmp) / "data" / "masks"]
        for folder in folders:
            masks = [crack_mask(path) for path in sorted(folder.iterdir())[: 4 if args.quick else args.count]]
            rates = median_rates({
                "skeletonize": (lambda index: [skeletonize(mask) for mask in masks], len(masks)),
                "thin": (lambda index: [thin(mask) for mask in masks], len(masks)),
                "find_cracks": (lambda index: [find_cracks(mask, JOIN_GAP.value, MIN_LENGTH.value) for mask in masks], len(masks)),
                "find_cracks, no joining": (lambda index: [find_cracks(mask) for mask in masks], len(masks)),
            }, windows, warmup=not args.quick)
            for path, (rate, _) in rates.items():
                rows.append({"mode": "measure", "masks": str(folder), "count": len(masks), "crack_fraction": round(float(np.mean([m.mean() for m in masks])), 4),
                             "path": path, "ms_per_mask": round(1e3 / rate, 3), "times_skeletonize": round(rates["skeletonize"][0] / rate, 2)})
    return rows
