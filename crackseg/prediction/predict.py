"""Batch prediction: folders of photos of any size and large rasters -> crack masks, probability maps, overlays, measurements.

:func:`predict_folder` reads top to bottom: plan (list the inputs, open each raster once,
resolve the outputs' units and check the folder: :mod:`crackseg.prediction.work`), load the runtime, predict the
photos, predict the rasters, write the tables. The probabilities come from
:class:`crackseg.model.inference.Predictor` (tiling, blending, batching, TTA); photos are decoded in
loader workers and written in writer threads, beside the model; rasters are predicted by
windows in :mod:`crackseg.prediction.streamed`. ``--engine ray`` hands the same work to Ray's actors instead
(:mod:`crackseg.prediction.ray_engine`). The files are named by
:class:`crackseg.prediction.outputs.PredictionsFolder`, each written under a temporary name and renamed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from crackseg.core.config import (
    AT_LEAST_ONE,
    FRACTION,
    JOIN_GAP,
    MAX_PIXELS,
    MIN_LENGTH,
    NON_NEGATIVE,
    POSITIVE,
    InferenceOptions,
    parse_length,
)
from crackseg.core.errors import InputError
from crackseg.core.storage import RemoteFile, StorageError, display_url, is_url
from crackseg.cracks.vectors import FORMATS as VECTOR_FORMATS
from crackseg.cracks.vectors import require_geo
from crackseg.cracks.widths import PX_PER_BAND, WidthClasses
from crackseg.data.images import describe_error, load_image
from crackseg.data.rasters import gdal_settings
from crackseg.model import distributed
from crackseg.model.inference import Predictor
from crackseg.model.runtimes import Runtime, RuntimeChoice, choose_runtime, load_runtime
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, Records, summarize_existing, write_image_outputs
from crackseg.prediction.remote_out import RemoteOutputs
from crackseg.prediction.report import write_report
from crackseg.prediction.streamed import Raster, RasterRun, allow_open_rasters, open_if_streamed, predict_rasters
from crackseg.prediction.work import Plan, collect_inputs, share, work_list

# Cracks cover a few percent of a crack photo's pixels: 1.6 % of CrackForest's mask pixels (6.3 % in its most cracked
# photo), 2.8 % of a 377-photo crack500 subset's (9.5 % at most). A run with more than a quarter of its pixels "crack",
# several times the most cracked photo, or with many photos mostly "crack", shows a model that does not fit the photos,
# not cracks: see crack_fraction_warning.
IMPLAUSIBLE_CRACK_FRACTION = 0.25  # of all predicted pixels
MOSTLY_CRACK = 0.5  # an image with more than this fraction of crack pixels is mostly crack
IMPLAUSIBLE_MOSTLY_CRACK_SHARE = 0.1  # of the images: at least this share mostly crack
ENGINES = ("local", "ray")  # local: this process, or torchrun's; ray: actors of a Ray cluster


@dataclass
class PredictOptions:
    """What predict writes and how; ``inference`` is how the model runs (shared with evaluate)."""

    out: Path | str  # a local folder, or an s3://bucket/prefix/ URL (see remote_out)
    inference: InferenceOptions = field(default_factory=InferenceOptions)
    threshold: float | None = None
    save_prob: int | None = None  # 8 or 16 bits
    overlay: bool = False
    px_size: float | None = None  # millimetres per pixel
    measure: bool = True
    overwrite: bool = False
    skip_existing: bool = False
    workers: int | None = None  # 0 on CPU, spare cores on a GPU
    recursive: bool = False
    join_gap: str = JOIN_GAP  # "12px" or "3mm": gaps within one crack that are bridged
    min_length: str = MIN_LENGTH  # cracks shorter than this are left out of tables and overlays
    width_classes: str | None = None  # a preset of WIDTH_CLASS_PRESETS or edges in mm; needs px_size
    report: bool = False  # also write OUT/report.html
    vectors: str | None = None  # geojson or gpkg: OUT/vectors/<name>.<ext>, one centreline per crack
    max_pixels: int = MAX_PIXELS  # larger rasters are refused
    overviews: bool = False  # GeoTIFF outputs get overviews, for GIS software
    lock: bool = True  # False (--no-lock): an --out in object storage is written without its lock object
    engine: str = "local"  # or "ray": a pool of Ray actors (see ray_engine)
    ray_address: str | None = None  # --engine ray: a running cluster (None: RAY_ADDRESS, else a local Ray)
    actors: int | None = None  # --engine ray: None is one per GPU, or per CPU
    gpus_per_actor: float | None = None  # --engine ray: None is 1 where the cluster has GPUs, else 0
    cpus_per_actor: int | None = None  # --engine ray: None is 1 (the threads of each actor's model)

    def __post_init__(self) -> None:
        """The same ranges the command line checks, for callers from Python."""
        if is_url(str(self.out)) and not str(self.out).startswith("s3://"):
            raise InputError(f"--out {display_url(str(self.out))}: predictions are written to a local folder or an "
                             "s3://bucket/prefix/ URL (http(s):// is read-only)")
        self.out = str(self.out) if is_url(str(self.out)) else Path(self.out)
        ranges = {"threshold": FRACTION, "px_size": POSITIVE, "workers": NON_NEGATIVE, "max_pixels": AT_LEAST_ONE,
                  "actors": AT_LEAST_ONE, "gpus_per_actor": NON_NEGATIVE, "cpus_per_actor": AT_LEAST_ONE}
        for name, valid in ranges.items():
            value = getattr(self, name)
            problem = None if value is None else valid.problem(value)
            if problem:
                raise InputError(f"--{name.replace('_', '-')} {problem}")
        if self.engine not in ENGINES:
            raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        ray_flags = {"--ray-address": self.ray_address, "--actors": self.actors, "--gpus-per-actor": self.gpus_per_actor,
                     "--cpus-per-actor": self.cpus_per_actor}
        given = [flag for flag, value in ray_flags.items() if value is not None]
        if given and self.engine != "ray":
            raise InputError(f"{given[0]} applies to --engine ray")
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

        Without either, a length in mm stays None: such an image is never measured (see ``_output_specs``).
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


class _Images(torch.utils.data.Dataset):
    """Decoded inputs for loader workers; a file that fails to download or decode yields its error message."""

    def __init__(self, inputs: list[tuple[int, Path | RemoteFile]]):
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        key, path = self.inputs[index]
        try:
            return key, load_image(path), None
        except StorageError as error:
            return key, None, error.reason
        except Exception as error:  # any undecodable input is reported, the others go on
            return key, None, describe_error(error)


def predict_folder(checkpoint: Path, inputs: list[str], options: PredictOptions) -> int:
    """Predict every input into ``options.out``; returns 0, or 1 when some input failed.

    Under torchrun each process takes every WORLD_SIZE-th photo and a share of every raster's
    tile rows; rank 0 joins the rasters' parts, measures them and writes the tables.
    """
    choice = choose_runtime(Path(checkpoint), options.inference)
    env = distributed.setup(choice.device)
    try:
        with contextlib.ExitStack() as cleanup:
            return _predict(choice, inputs, options, env, cleanup)
    finally:
        distributed.teardown()


def _predict(choice: RuntimeChoice, inputs: list[str], options: PredictOptions, env: distributed.Environment,
             cleanup: contextlib.ExitStack) -> int:
    if options.engine == "ray":
        from crackseg.prediction.ray_engine import require_ray

        require_ray()
        if env.distributed:
            raise InputError("--engine ray spreads the work over Ray's actors; start it as one process, without torchrun")
    plan = _plan(inputs, options, cleanup)
    # a model file that is refused leaves no --out folder behind; Ray's actors load their own, the driver's stays on the CPU
    runtime = load_runtime(choice, torch.device("cpu") if options.engine == "ray" else env.device)
    out = plan.remote or plan.folder
    listed = distributed.decided_on_main(env, out.prepare, list(plan.outputs.values()), options.overwrite, options.skip_existing)
    if plan.remote:
        plan.remote.existing = listed  # rank 0's listing, for every process's --skip-existing
    try:
        return _run(plan, runtime, choice, options, env)
    finally:
        out.release()


def _run(plan: Plan, runtime: Runtime, choice: RuntimeChoice, options: PredictOptions, env: distributed.Environment) -> int:
    threshold = runtime.threshold if options.threshold is None else options.threshold
    predictor = Predictor(runtime.model, runtime.device, options.inference, runtime.amp_dtype)
    if env.is_main:
        for warning in plan.warnings:
            print(f"crackseg: warning: {warning}", file=sys.stderr)
    records = Records()
    run = RasterRun(predictor, threshold, plan.folder, options.save_prob, options.overviews)
    if options.engine == "ray":
        from crackseg.prediction.ray_engine import RayPool, predict_on_ray

        pool = RayPool(options.ray_address, options.actors, options.gpus_per_actor, options.cpus_per_actor or 1)
        predict_on_ray(plan, run, choice, pool, options.max_pixels, records)
    else:
        _predict_photos(plan, predictor, threshold, options.workers, env, records)
        kept = distributed.broadcast_from_main({raster.key for raster in plan.rasters if plan.kept(raster.key)} if env.is_main else None)
        predict_rasters(plan.rasters, run, env, records, kept, plan.upload, plan.remote)
    if plan.remote:  # each process names its own staged masks by their objects
        plan.remote.name_masks(list(records.rows.values()))
    gathered = Records.joined(distributed.gather_objects(records, env))
    return _write_tables(plan, gathered, options, threshold) if env.is_main else 0


def _plan(inputs: list[str], options: PredictOptions, cleanup: contextlib.ExitStack) -> Plan:
    """List the inputs, open each raster (kept open in ``cleanup`` until it is predicted), and
    resolve every input's outputs: sizes, pixel types and units are checked before any work."""
    remote = cleanup.enter_context(RemoteOutputs(options.out, options.lock)) if isinstance(options.out, str) else None
    folder = remote.folder if remote else PredictionsFolder(options.out)
    listed = collect_inputs(inputs, options.recursive, options.out)
    tiffs = sum(path.suffix.lower() in (".tif", ".tiff") for path, _ in listed)
    if tiffs and importlib.util.find_spec("rasterio") is not None:  # without it, open_if_streamed says what a raster needs
        cleanup.enter_context(gdal_settings())
        allow_open_rasters(tiffs)
    sources = {}
    for key, (path, _) in enumerate(listed):
        source = open_if_streamed(path, options.max_pixels)
        if source is not None:
            cleanup.callback(source.close)
            sources[key] = source
    scales, notes = {}, []  # a raster's own pixel size in mm, or None; why a georeferenced raster has none
    for key, source in sources.items():
        scales[key], note = source.px_size_mm()
        if note and options.px_size is None:
            notes.append(note)
    spec, raster_specs = _output_specs(listed, scales, options)
    rasters = [Raster(key, listed[key][0], listed[key][1], source, raster_specs[key]) for key, source in sources.items()]
    photos = [(key, path, name) for key, (path, name) in enumerate(listed) if key not in sources]
    outputs = {key: folder.outputs(name, raster_specs.get(key, spec), raster=key in sources) for key, (_, name) in enumerate(listed)}
    warnings = notes + list(dict.fromkeys(w for s in (spec, *raster_specs.values()) for w in _resolution_warnings(s)))
    return Plan(folder, remote, photos, rasters, spec, outputs, warnings, options.skip_existing)


def _predict_photos(plan: Plan, predictor: Predictor, threshold: float, workers: int | None, env: distributed.Environment,
                    records: Records) -> None:
    """This process's share of the photos: decoded in loader workers, written in writer threads."""
    todo = []
    for item in share(work_list(plan, env.world_size), env.rank, env.world_size):
        if item.band is None and plan.kept(item.key):
            records.add(item.key, *summarize_existing(item.path, plan.folder.mask(item.name), plan.spec))
        elif item.band is None:
            todo.append((item.key, item.path))
    names = {key: (path, name) for key, path, name in plan.photos}
    workers = default_workers(env.device) if workers is None else workers
    loader = torch.utils.data.DataLoader(
        _Images(todo), batch_size=None, num_workers=workers, pin_memory=env.device.type == "cuda",
        prefetch_factor=4 if workers else None,
    )
    decoded: dict[int, torch.Tensor] = {}

    def images():
        for key, image, error in loader:
            if error is not None:
                records.fail(names[key][0], error)
                continue
            decoded[key] = image
            yield key, image

    with ThreadPoolExecutor(workers) if workers else _Inline() as writers:
        futures = []
        for key, prob in tqdm(predictor.probabilities(images()), total=len(todo), desc="predict", disable=None if env.is_main else True, unit="img"):
            futures.append((key, writers.submit(_write_photo, plan, key, names[key], decoded.pop(key), prob, threshold)))
        for key, future in futures:
            try:
                records.add(key, *future.result())
            except (OSError, StorageError) as error:
                records.errors.append({"path": str(names[key][0]), "error": f"cannot write outputs: {error}"})


def _write_photo(plan: Plan, key: int, named: tuple[Path | RemoteFile, str], image: torch.Tensor, prob: torch.Tensor,
                 threshold: float) -> tuple[dict, list[dict]]:
    """One photo's files written (in a writer thread) and, for an --out in object storage, uploaded as soon as they are."""
    rows = write_image_outputs(plan.folder, *named, image, prob, threshold, plan.spec)
    plan.upload(key)
    return rows


def _write_tables(plan: Plan, records: Records, options: PredictOptions, threshold: float) -> int:
    """predictions.csv, cracks.csv, errors.csv, summary.json and the report; returns the exit status."""
    folder, remote = plan.folder, plan.remote
    show = remote.display if remote else str
    implausible = crack_fraction_warning(list(records.rows.values()), threshold)
    if implausible:
        print(f"crackseg: warning: {implausible}", file=sys.stderr)
    warnings = plan.warnings + ([implausible] if implausible else [])
    summary = folder.write_tables(records, plan.spec, warnings, options.overwrite, threshold)
    if options.report:
        write_report(folder.root)
    if remote:
        remote.finish()
    print(f"{len(records.rows)} images predicted into {show(folder.root)}"
          + (f"; {len(records.errors)} failed, listed in {show(folder.errors_csv)}" if records.errors else ""))
    if plan.spec.measure:
        print(_summary_line(summary))
    if options.report:
        print(f"report written to {show(folder.report_html)}")
    return 1 if records.errors else 0


def default_workers(device: torch.device) -> int:
    """Decoding processes (and writer threads) when the user names none.

    On CPU the model's threads already use every core, and decoding and writing beside them
    slowed prediction down more than doing them in turn (docs/benchmarks.md).
    """
    return 0 if device.type == "cpu" else distributed.spare_cores()


def _output_specs(listed: list[tuple[Path | RemoteFile, str]], scales: dict[int, float | None],
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


def _resolution_warnings(spec: OutputSpec) -> list[str]:
    """Width classes whose narrowest band spans under :data:`~crackseg.cracks.widths.PX_PER_BAND` pixels cannot be
    trusted (a width is known to about +-1 px): the warning names the pixel size they need."""
    classes = spec.width_classes
    if classes is None or spec.px_size is None or spec.px_size <= classes.coarsest_px_size_mm():
        return []
    band = classes.narrowest_band_mm()
    return [f"width classes {classes.described}: the narrowest band is {band:g} mm, {band / spec.px_size:.2g} px at {spec.px_size:g} mm "
            f"per pixel; widths are known to about +-1 px, so cracks near a band edge may be classed one band off; the classes need "
            f"a pixel size of {classes.coarsest_px_size_mm():.3g} mm or finer ({PX_PER_BAND} px per band)"]


def crack_fraction_warning(rows: list[dict], threshold: float) -> str | None:
    """Why a run's masks are implausible for crack photos, from its predictions.csv rows, or None.

    Implausible: more than IMPLAUSIBLE_CRACK_FRACTION of all predicted pixels (a raster's valid ones) are crack, or at
    least IMPLAUSIBLE_MOSTLY_CRACK_SHARE of the images are mostly crack (over MOSTLY_CRACK of their pixels).
    """
    if not rows:
        return None
    pixels = sum(row.get("valid_px", row["width"] * row["height"]) for row in rows)
    fraction = sum(row["area_px"] for row in rows) / pixels if pixels else 0.0
    mostly = sum(row["crack_fraction"] > MOSTLY_CRACK for row in rows)
    if fraction <= IMPLAUSIBLE_CRACK_FRACTION and mostly / len(rows) < IMPLAUSIBLE_MOSTLY_CRACK_SHARE:
        return None
    return (f"{100 * fraction:.1f}% of the pixels predicted are crack, and {mostly} of {len(rows)} images are mostly crack "
            f"(over {MOSTLY_CRACK:.0%} of their pixels), where cracks cover a few percent of crack photos: the photos may be "
            f"unlike the model's training photos, the model may be for another task, or the threshold ({threshold:g}) too low")


def _summary_line(summary: dict) -> str:
    line = f"{summary['cracks']} cracks, {summary['length_px']:g} px"
    if summary.get("length_mm") is not None:
        line += f" = {summary['length_mm'] / 1000:.3f} m"
        if summary["px_size_mm"] is not None:
            line += f" (pixel size {summary['px_size_mm']:g} mm)"
    classes = summary.get("width_classes")
    if classes:
        standard = f" ({classes['title']})" if classes["title"] else ""
        line += (f"; length by {classes['graded']}-width class{standard}, mm: "
                 + ", ".join(f"{k}: {v:g}" for k, v in classes["length_mm"].items()))
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


