"""Batch prediction: folders of photos of any size -> crack masks, probability maps, overlays, measurements.

The probabilities come from :class:`crackseg.inference.Predictor` (tiling, blending,
batching, TTA). Decoding runs in loader workers and encoding in writer threads, beside
the model. Every file is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import contextlib
import glob
import sys
from collections import OrderedDict
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from crackseg import distributed
from crackseg.config import AT_LEAST_ONE, FRACTION, JOIN_GAP, MAX_PIXELS, MIN_LENGTH, NON_NEGATIVE, POSITIVE, TILE, TILE_OVERLAP, parse_length
from crackseg.errors import InputError
from crackseg.export import check_runtime_amp, load_inference_model, resolve_backend
from crackseg.files import ensure_writable_folder, remove_orphan_temps, write_csv
from crackseg.images import IMAGE_SUFFIXES, describe_error, load_image
from crackseg.inference import Predictor
from crackseg.measure import WidthClasses
from crackseg.outputs import OutputSpec, outputs_of, summarize_existing, table_rows, vector_path, write_image_outputs, write_summary
from crackseg.rasters import RasterSource, gdal_settings
from crackseg.report import write_report
from crackseg.streamed import discard_parts, is_streamed, merge_parts, predict_raster, raster_outputs, summarize_raster
from crackseg.vectors import FORMATS as VECTOR_FORMATS
from crackseg.vectors import centrelines, require_geo, write_vectors


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
    backend: str = "auto"  # torch, onnxruntime or openvino; auto: from the model file
    join_gap: str = JOIN_GAP  # "12px" or "3mm": gaps within one crack that are bridged
    min_length: str = MIN_LENGTH  # cracks shorter than this are left out of tables and overlays
    width_classes: str | None = None  # bre251, aci224 or edges in mm; needs px_size
    report: bool = False  # also write OUT/report.html
    vectors: str | None = None  # geojson or gpkg: OUT/vectors/<name>.<ext>, one centreline per crack
    max_pixels: int = MAX_PIXELS  # larger rasters are refused
    overviews: bool = False  # GeoTIFF outputs get overviews, for GIS software

    def __post_init__(self) -> None:
        """The same ranges the command line checks, for callers from Python."""
        ranges = {"tile": AT_LEAST_ONE, "overlap": NON_NEGATIVE, "batch_size": AT_LEAST_ONE, "threshold": FRACTION,
                  "px_size": POSITIVE, "workers": NON_NEGATIVE, "max_pixels": AT_LEAST_ONE}
        for name, valid in ranges.items():
            value = getattr(self, name)
            problem = None if value is None else valid.problem(value)
            if problem:
                raise InputError(f"--{name.replace('_', '-')} {problem}")
        if self.overlap >= self.tile:
            raise InputError(f"--overlap ({self.overlap} px) must be smaller than --tile ({self.tile} px)")
        self.output_spec()  # lengths and classes are checked now, not after every image ran

    def scale_needed_by(self) -> str | None:
        """The flag that needs a pixel size in mm (width classes, or a length in mm), if any."""
        if self.width_classes is not None:
            return "--width-classes"
        for flag, text in (("--join-gap", self.join_gap), ("--min-length", self.min_length)):
            if self._length(text, flag)[1] == "mm":
                return f"{flag} {text}"
        return None

    def output_spec(self, image_px_size: float | None = None) -> OutputSpec:
        """The outputs of an image, lengths in pixels: mm are converted with --px-size, else with the image's own scale.

        Without either, a length in mm stays None: such an image is never measured (see ``_predict``).
        """
        px_size = self.px_size if self.px_size is not None else image_px_size
        classes = None
        if self.width_classes is not None:
            try:
                classes = WidthClasses.parse(self.width_classes)
            except ValueError as error:
                raise InputError(f"--width-classes {error}") from None
        if self.vectors is not None and self.vectors not in VECTOR_FORMATS:
            raise InputError(f"--vectors must be one of {', '.join(VECTOR_FORMATS)}, got {self.vectors!r}")
        if self.vectors and not self.measure:
            raise InputError("--vectors draws the measured cracks; leave out --no-measure")
        if self.vectors:
            require_geo()
        return OutputSpec(self.save_prob, self.overlay, self.measure, px_size, self._pixels(self.join_gap, "--join-gap", px_size),
                          self._pixels(self.min_length, "--min-length", px_size), classes, self.vectors)

    @staticmethod
    def _length(text: str, flag: str) -> tuple[float, str]:
        try:
            return parse_length(text)
        except ValueError as error:
            raise InputError(f"{flag} {error}") from None

    def _pixels(self, text: str, flag: str, px_size: float | None) -> float | None:
        value, unit = self._length(text, flag)
        if unit == "px":
            return value
        return None if px_size is None else value / px_size


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
            return key, None, describe_error(error)


def predict_folder(checkpoint: Path, inputs: list[str], options: PredictOptions) -> int:
    """Predict every input into ``options.out``; returns 0, or 1 when some input failed.

    Under torchrun each process takes every WORLD_SIZE-th photo and a share of every raster's
    tile rows; rank 0 joins the rasters' parts, measures them and writes the CSVs.
    """
    backend = resolve_backend(Path(checkpoint), options.backend)
    if backend != "torch" and options.channels_last:
        raise InputError(f"--channels-last applies to --backend torch; {backend} chooses its own layout")
    check_runtime_amp(backend, options.amp)
    env = distributed.setup("cpu" if backend != "torch" and options.device == "auto" else options.device)
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
    streamed = {key for key, (path, _) in enumerate(listed) if is_streamed(path)}
    scales = {}  # a raster's own pixel size in mm, or None
    notes = []  # why a georeferenced raster has none
    with gdal_settings() if streamed else contextlib.nullcontext():
        for key in streamed:  # sizes and pixel types are checked before any work
            with RasterSource(listed[key][0], options.max_pixels) as source:
                scales[key], note = source.px_size_mm()
            if note and options.px_size is None:
                notes.append(note)
    spec, raster_specs = _output_specs(listed, scales, options)
    outputs = [raster_outputs(out, name, spec) if key in streamed else outputs_of(out, name, spec)
               for key, (_, name) in enumerate(listed)]
    distributed.decided_on_main(env, _prepare_out, out, outputs, options)
    mask_paths = [paths[0] for paths in outputs]
    model = load_inference_model(checkpoint, options.backend, env.device, options.amp)
    channels_last = isinstance(model, torch.nn.Module) and options.channels_last
    if channels_last:
        model.to(memory_format=torch.channels_last)
    threshold = model.threshold if options.threshold is None else options.threshold
    amp_dtype = distributed.resolve_amp(options.amp, env.device) if isinstance(model, torch.nn.Module) else None
    predictor = Predictor(model, env.device, options.tile, options.overlap, options.batch_size, options.tta, amp_dtype, channels_last, options.resize)

    warnings = notes + list(dict.fromkeys(w for s in (spec, *raster_specs.values()) for w in _resolution_warnings(s)))
    if env.is_main:
        for warning in warnings:
            print(f"crackseg: warning: {warning}", file=sys.stderr)
    mine = [key for key in range(len(listed)) if key not in streamed][env.rank :: env.world_size]
    rows: dict[int, dict] = {}
    crack_rows: list[dict] = []
    errors: list[dict] = []
    todo = []
    for key in mine:
        if options.skip_existing and all(path.exists() for path in outputs[key]):
            rows[key], cracks = summarize_existing(listed[key][0], mask_paths[key], spec)
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
                tqdm.write(f"crackseg: error: {listed[key][0]}: {error}", file=sys.stderr)
                continue
            decoded[key] = image
            yield key, image

    with ThreadPoolExecutor(workers) if workers else _Inline() as writers:
        futures = []
        for key, prob in tqdm(predictor.probabilities(images()), total=len(todo), desc="predict", disable=None if env.is_main else True, unit="img"):
            image = decoded.pop(key)
            futures.append((key, writers.submit(write_image_outputs, out, *listed[key], image, prob, threshold, spec)))
        for key, future in futures:
            try:
                rows[key], cracks = future.result()
                crack_rows += cracks
            except OSError as error:
                errors.append({"path": str(listed[key][0]), "error": f"cannot write outputs: {error}"})

    for key in sorted(streamed):  # every process predicts a part of each raster; rank 0 joins and measures them
        path, name = listed[key]
        status = "skipped: exists" if options.skip_existing and all(file.exists() for file in outputs[key]) else "ok"
        pixels = None  # (crack, valid) counted while predicting
        if status == "ok":
            parts = distributed.gather_objects(_predict_raster_part(path, outputs[key], predictor, threshold, options, env), env)
            failures = [failure for failure, _ in parts if failure]
            if env.is_main and not failures and env.distributed:
                failures = _merge_raster_parts(path, outputs[key], predictor, options, env.world_size)
            pixels = None if failures else tuple(map(sum, zip(*(counts for _, counts in parts))))
        if not env.is_main:
            continue
        try:
            if status == "ok" and failures:
                raise InputError(failures[0])
            rows[key], cracks = _raster_rows(path, out, name, mask_paths[key], raster_specs[key], status, pixels)
        except (InputError, OSError) as error:  # rasterio's read errors are OSErrors
            discard_parts(outputs[key], env.world_size)
            errors.append({"path": str(path), "error": str(error)})
            tqdm.write(f"crackseg: error: {path}: {error}", file=sys.stderr)
            continue
        crack_rows += cracks

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
        summary = write_summary(out, [all_rows[k] for k in sorted(all_rows)], [r for part in gathered for r in part[1]], spec, warnings)
        print(f"{len(all_rows)} images predicted into {out}" + (f"; {len(all_errors)} failed, listed in {out / 'errors.csv'}" if all_errors else ""))
        if spec.measure:
            print(_summary_line(summary))
        if options.report:
            print(f"report written to {write_report(out)}")
        return 1 if all_errors else 0
    return 0


def _output_specs(listed: list[tuple[Path, str]], scales: dict[int, float | None],
                  options: PredictOptions) -> tuple[OutputSpec, dict[int, OutputSpec]]:
    """The run's spec (photos and the summary) and each raster's, with the raster's own scale unless --px-size is given.

    Width classes and lengths in mm need a scale for every image; the run's scale is --px-size,
    or the one scale all inputs share when every input is a raster that carries it.
    """
    needed_by = options.scale_needed_by()
    if needed_by and options.px_size is None:
        for key, (path, _) in enumerate(listed):
            if scales.get(key) is None:
                kind = "a photo" if key not in scales else "a raster without a projected, square-pixel georeferencing"
                raise InputError(f"{needed_by} needs the pixel size in mm: give --px-size ({path} is {kind}, which carries none)")
    own = set(scales.values())
    common = own.pop() if len(own) == 1 and len(scales) == len(listed) else None
    return options.output_spec(common), {key: options.output_spec(scale) for key, scale in scales.items()}


def _predict_raster_part(path: Path, outputs: list[Path], predictor: Predictor, threshold: float,
                         options: PredictOptions, env: distributed.Environment) -> tuple[str | None, tuple[int, int]]:
    """This process's part of a raster: (what went wrong or None, its (crack, valid) pixel counts)."""
    try:
        return None, predict_raster(path, outputs, predictor, threshold, options.save_prob, options.max_pixels, options.overviews,
                                    (env.rank, env.world_size), progress=env.is_main)
    except (InputError, OSError) as error:  # rasterio's read errors are OSErrors
        return str(error), (0, 0)


def _merge_raster_parts(path: Path, outputs: list[Path], predictor: Predictor, options: PredictOptions, count: int) -> list[str]:
    try:
        merge_parts(path, outputs[: 2 if options.save_prob else 1], predictor.tile, predictor.overlap, count, options.overviews)
    except (InputError, OSError) as error:
        return [f"joining the processes' parts: {error}"]
    return []


def _raster_rows(path: Path, out: Path, name: str, mask_path: Path, spec: OutputSpec, status: str,
                 pixels: tuple[int, int] | None = None) -> tuple[dict, list[dict]]:
    """The table rows of a raster predicted by windows, with the pixel size of its spec."""
    counts, cracks, links = summarize_raster(mask_path, spec.measure, spec.join_gap_px, spec.min_length_px, pixels=pixels,
                                             links=bool(spec.vectors))
    transform = counts.pop("transform")
    counts["px_size_mm"] = spec.px_size
    row, crack_rows = table_rows(path, mask_path, counts, cracks, spec, status)
    if transform is not None:
        for item in crack_rows:  # the bounding box in map coordinates too
            xs, ys = zip(*(transform @ (col, row) for row in (item["top"], item["bottom"]) for col in (item["left"], item["right"])))
            item |= {"x_min": min(xs), "y_min": min(ys), "x_max": max(xs), "y_max": max(ys)}
    if spec.vectors:
        write_vectors(vector_path(out, name, spec.vectors), spec.vectors, crack_rows, centrelines(links, transform), counts["crs"] or None)
    return row, crack_rows


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


def _resolution_warnings(spec: OutputSpec) -> list[str]:
    """Width classes finer than a pixel cannot be told apart: a width is known to about +-1 px."""
    classes = spec.width_classes
    if classes is None or spec.px_size is None or classes.narrowest_band_mm() >= spec.px_size:
        return []
    return [f"width classes {classes.name}: the narrowest band is {classes.narrowest_band_mm():g} mm, less than one pixel "
            f"({spec.px_size:g} mm); widths are known to about +-1 px, so cracks near a band edge may be classed one band off"]


def _summary_line(summary: dict) -> str:
    line = f"{summary['cracks']} cracks, {summary['length_px']:g} px"
    if summary.get("length_mm") is not None:
        line += f" = {summary['length_mm'] / 1000:.3f} m"
        if summary["px_size_mm"] is not None:
            line += f" (pixel size {summary['px_size_mm']:g} mm)"
    classes = summary.get("width_classes")
    if classes:
        line += "; length by max-width class (mm): " + ", ".join(f"{k}: {v:g}" for k, v in classes["length_mm"].items())
    return line


class _Inline(Executor):
    """Runs each task as it is submitted: with --workers 0 all work stays in the main thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # delivered by result(), as a thread pool would
            future.set_exception(error)
        return future


