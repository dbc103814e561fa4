"""Batch prediction: folders of photos of any size -> crack masks, probability maps, overlays, measurements.

The probabilities come from :class:`crackseg.inference.Predictor` (tiling, blending,
batching, TTA). Decoding runs in loader workers and encoding in writer threads, beside
the model. Every file is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import glob
import io
from collections import OrderedDict
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from crackseg import distributed
from crackseg.checkpoint import load_model
from crackseg.config import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, TILE, TILE_OVERLAP
from crackseg.errors import InputError
from crackseg.files import ensure_writable_folder, remove_orphan_temps, write_atomic, write_csv
from crackseg.images import IMAGE_SUFFIXES, load_image
from crackseg.inference import Predictor
from crackseg.measure import measure_cracks


@dataclass
class PredictOptions:
    out: Path
    tile: int = TILE
    overlap: int = TILE_OVERLAP
    batch_size: int | None = None  # 8 on a GPU, 1 on CPU
    threshold: float | None = None
    tta: str = "none"
    save_prob: int | None = None  # 8 or 16 bits
    overlay: bool = False
    resize: tuple[int, int] | None = None
    px_size: float | None = None  # millimetres per pixel
    measure: bool = True
    overwrite: bool = False
    skip_existing: bool = False
    workers: int | None = None  # 0 on CPU, spare cores on a GPU
    device: str = "auto"
    amp: str = "auto"
    channels_last: bool = False
    recursive: bool = False

    def __post_init__(self) -> None:
        """The same ranges the command line checks, for callers from Python."""
        ranges = {"tile": AT_LEAST_ONE, "overlap": NON_NEGATIVE, "batch_size": AT_LEAST_ONE, "threshold": FRACTION,
                  "px_size": POSITIVE, "workers": NON_NEGATIVE}
        for name, valid in ranges.items():
            value = getattr(self, name)
            problem = None if value is None else valid.problem(value)
            if problem:
                raise InputError(f"--{name.replace('_', '-')} {problem}")
        if self.overlap >= self.tile:
            raise InputError(f"--overlap ({self.overlap} px) must be smaller than --tile ({self.tile} px)")


def collect_inputs(inputs: list[str], recursive: bool = False, out: Path | None = None) -> list[tuple[Path, str]]:
    """(image path, output name) for every input file, folder or glob, in a stable order.

    Output names mirror the inputs: a folder's files keep their path below it (without suffix),
    single files and glob matches keep their stem. Two inputs with one output name are an error.
    Nothing inside ``out`` is ever an input: walks skip it, and naming a file there is an error.
    """
    inside_out = (lambda p: Path(p).resolve().is_relative_to(Path(out).resolve())) if out is not None else (lambda p: False)
    found: list[tuple[Path, str]] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            files = sorted(
                p for p in path.glob(pattern) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not inside_out(p)
            )
            found += [(p, p.relative_to(path).with_suffix("").as_posix()) for p in files]
        elif path.is_file():
            if inside_out(path):
                raise InputError(f"{path}: is inside --out {out}, where predict writes; it is never read as input")
            found.append((path, path.stem))
        else:
            matches = sorted(Path(p) for p in glob.glob(text, recursive=recursive) if Path(p).is_file() and not inside_out(p))
            if not matches:
                raise InputError(f"{text}: no such file or folder, and no file matches it as a pattern")
            found += [(p, p.stem) for p in matches if p.suffix.lower() in IMAGE_SUFFIXES]
    names: dict[str, Path] = {}
    for image, name in found:
        if name in names and names[name] != image:
            raise InputError(f"{image} and {names[name]} would both be written as {name}.png; predict them into different --out folders")
        names[name] = image
    unique = list(OrderedDict((image, name) for image, name in found).items())
    if not unique:
        raise InputError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {', '.join(inputs)}")
    return unique


class _Images(torch.utils.data.Dataset):
    """Decoded inputs for loader workers; a file that fails to decode yields its error message."""

    def __init__(self, inputs: list[tuple[int, Path]]):
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        key, path = self.inputs[index]
        try:
            return key, load_image(path), None
        except Exception as error:  # any undecodable input is reported, the others go on
            return key, None, f"{type(error).__name__}: {error}"


def predict_folder(checkpoint: Path, inputs: list[str], options: PredictOptions) -> int:
    """Predict every input into ``options.out``; returns 0, or 1 when some input failed.

    Under torchrun each process takes every WORLD_SIZE-th input; rank 0 writes the CSVs.
    """
    env = distributed.setup(options.device)
    try:
        return _predict(checkpoint, inputs, options, env)
    finally:
        distributed.teardown()


def default_workers(device: torch.device) -> int:
    """Decoding processes (and writer threads) when the user names none.

    On CPU the model's threads already use every core, and decoding and writing beside them
    slowed prediction down more than doing them in turn (docs/benchmarks.md).
    """
    return 0 if device.type == "cpu" else distributed.spare_cores()


def _predict(checkpoint: Path, inputs: list[str], options: PredictOptions, env: distributed.Environment) -> int:
    out = Path(options.out)
    listed = collect_inputs(inputs, options.recursive, out)
    outputs = [_outputs_of(out, name, options) for _, name in listed]
    distributed.decided_on_main(env, _prepare_out, out, outputs, options)
    mask_paths = [paths[0] for paths in outputs]
    model = load_model(checkpoint, env.device)
    if options.channels_last:
        model.to(memory_format=torch.channels_last)
    threshold = model.threshold if options.threshold is None else options.threshold
    amp_dtype = distributed.resolve_amp(options.amp, env.device)
    predictor = Predictor(model, env.device, options.tile, options.overlap, options.batch_size, options.tta, amp_dtype, options.channels_last, options.resize)

    mine = list(range(env.rank, len(listed), env.world_size))
    rows: dict[int, dict] = {}
    crack_rows: list[dict] = []
    errors: list[dict] = []
    todo = []
    for key in mine:
        if options.skip_existing and all(path.exists() for path in outputs[key]):
            mask = np.asarray(Image.open(mask_paths[key]).convert("L")) > 127
            rows[key], cracks = _summarize(listed[key][0], mask_paths[key], mask, options, "skipped: exists")
            crack_rows += cracks
        else:
            todo.append((key, listed[key][0]))
    workers = default_workers(env.device) if options.workers is None else options.workers
    loader = torch.utils.data.DataLoader(
        _Images(todo), batch_size=None, num_workers=workers, pin_memory=env.device.type == "cuda",
        prefetch_factor=4 if workers else None,
    )
    decoded: dict[int, torch.Tensor] = {}

    def images():
        for key, image, error in loader:
            if error is not None:
                errors.append({"path": str(listed[key][0]), "error": error})
                tqdm.write(f"crackseg: error: {listed[key][0]}: {error}")
                continue
            decoded[key] = image
            yield key, image

    with ThreadPoolExecutor(workers) if workers else _Inline() as writers:
        futures = []
        for key, prob in tqdm(predictor.probabilities(images()), total=len(todo), desc="predict", disable=None if env.is_main else True, unit="img"):
            image = decoded.pop(key)
            futures.append((key, writers.submit(_write_outputs, out, listed[key], image, prob, threshold, options)))
        for key, future in futures:
            try:
                rows[key], cracks = future.result()
                crack_rows += cracks
            except OSError as error:
                errors.append({"path": str(listed[key][0]), "error": f"cannot write outputs: {error}"})

    gathered = distributed.gather_objects((rows, crack_rows, errors), env)
    if env.is_main:
        all_rows = {k: v for part in gathered for k, v in part[0].items()}
        write_csv(out / "predictions.csv", [all_rows[k] for k in sorted(all_rows)])
        if options.measure:
            write_csv(out / "cracks.csv", sorted((r for part in gathered for r in part[1]), key=lambda r: (r["path"], r["crack"])))
        elif options.overwrite:
            (out / "cracks.csv").unlink(missing_ok=True)  # it measured masks this run replaced
        all_errors = [e for part in gathered for e in part[2]]
        if all_errors or (out / "errors.csv").exists():
            write_csv(out / "errors.csv", all_errors, ["path", "error"])
        print(f"{len(all_rows)} images predicted into {out}" + (f"; {len(all_errors)} failed, listed in {out / 'errors.csv'}" if all_errors else ""))
        return 1 if all_errors else 0
    return 0


def _outputs_of(out: Path, name: str, options: PredictOptions) -> list[Path]:
    """The files one image gets: its mask first, then what the options ask for."""
    paths = [out / "masks" / f"{name}.png"]
    if options.save_prob:
        paths.append(out / "probs" / f"{name}.png")
    if options.overlay:
        paths.append(out / "overlays" / f"{name}.jpg")
    return paths


def _prepare_out(out: Path, outputs: list[list[Path]], options: PredictOptions) -> None:
    """Check --out before any work: writable, and nothing replaced unless asked; clear interrupted writes."""
    if options.overwrite and options.skip_existing:
        raise InputError("--overwrite and --skip-existing contradict each other; choose one")
    ensure_writable_folder(out, "--out")
    if not (options.overwrite or options.skip_existing):
        existing = [path for paths in outputs for path in paths if path.exists()]
        if existing:
            raise InputError(
                f"{len(existing)} outputs already exist in {out} (e.g. {existing[0]}); "
                "pass --skip-existing to keep them and finish the rest, or --overwrite to replace them"
            )
        if (out / "predictions.csv").exists():
            raise InputError(f"{out / 'predictions.csv'} already exists; pass --skip-existing or --overwrite")
    for folder in [out, *(path for path in out.rglob("*") if path.is_dir())]:
        remove_orphan_temps(folder)


class _Inline(Executor):
    """Runs each task as it is submitted: with --workers 0 all work stays in the main thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # delivered by result(), as a thread pool would
            future.set_exception(error)
        return future


def _write_outputs(out: Path, item: tuple[Path, str], image: torch.Tensor, prob: torch.Tensor, threshold: float, options: PredictOptions):
    path, name = item
    mask = (prob >= threshold).numpy()
    mask_path = out / "masks" / f"{name}.png"
    _write_png(mask_path, mask.astype(np.uint8) * 255)
    if options.save_prob == 8:
        _write_png(out / "probs" / f"{name}.png", (prob * 255).round().byte().numpy())
    elif options.save_prob == 16:
        _write_png(out / "probs" / f"{name}.png", (prob.double() * 65535).round().numpy().astype(np.uint16))
    if options.overlay:
        write_atomic(out / "overlays" / f"{name}.jpg", _overlay_jpeg(image, mask))
    return _summarize(path, mask_path, mask, options, "ok")


def _summarize(path: Path, mask_path: Path, mask: np.ndarray, options: PredictOptions, status: str) -> tuple[dict, list[dict]]:
    """predictions.csv's row for one mask and, when measuring, cracks.csv's rows."""
    height, width = mask.shape
    row = {"path": str(path), "mask": str(mask_path), "width": width, "height": height, "crack_fraction": round(float(mask.mean()), 6)}
    cracks = measure_cracks(mask) if options.measure else []
    if options.measure:
        total_length = sum(c.length_px for c in cracks)
        row |= {
            "cracks": len(cracks),
            "length_px": round(total_length, 2),
            "mean_width_px": round(sum(c.mean_width_px * c.length_px for c in cracks) / total_length, 3) if total_length else 0.0,
            "max_width_px": round(max((c.max_width_px for c in cracks), default=0.0), 3),
        }
    row["area_px"] = int(mask.sum())
    crack_rows = [
        {"path": str(path), "crack": number, "length_px": round(c.length_px, 2), "mean_width_px": round(c.mean_width_px, 3),
         "max_width_px": round(c.max_width_px, 3), "area_px": c.area_px, "top": c.bbox[0], "left": c.bbox[1],
         "bottom": c.bbox[2], "right": c.bbox[3]}
        for number, c in enumerate(cracks, 1)
    ]
    if options.px_size is not None:
        for item in [row, *crack_rows]:
            for key in ("length", "mean_width", "max_width"):
                if f"{key}_px" in item:
                    item[f"{key}_mm"] = round(item[f"{key}_px"] * options.px_size, 4)
            item["area_mm2"] = round(item["area_px"] * options.px_size**2, 4)
    row["status"] = status
    return row, crack_rows


def _overlay_jpeg(image: torch.Tensor, mask: np.ndarray) -> bytes:
    """The photo with crack pixels tinted red, for people to look at."""
    photo = image.permute(1, 2, 0).numpy().astype(np.float32)
    tint = np.array([255.0, 30.0, 30.0], np.float32)
    photo[mask] = 0.35 * photo[mask] + 0.65 * tint
    buffer = io.BytesIO()
    Image.fromarray(photo.round().astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _write_png(path: Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG", compress_level=1)
    write_atomic(path, buffer.getvalue())

