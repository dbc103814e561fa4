"""Batch prediction: folders of photos of any size and large rasters -> crack masks, probability maps, overlays, measurements.

:func:`predict_folder` reads top to bottom: plan (list the inputs, open each raster once,
resolve the outputs' units and check the folder: :mod:`crackseg.prediction.work`), load the runtime, predict the
photos and rasters on the chosen engine (:mod:`crackseg.prediction.engines`: this process or torchrun's, or Ray's
actors), write the tables. The probabilities come from :class:`crackseg.model.inference.Predictor` (tiling, blending,
batching, TTA). The files are named by
:class:`crackseg.prediction.outputs.PredictionsFolder`, each written under a temporary name and renamed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.staging import OutFailed, StagedFolder
from crackseg.core.storage import RemoteFile
from crackseg.cracks.widths import PX_PER_BAND
from crackseg.data.inputs import collect_inputs
from crackseg.data.rasters import gdal_settings, open_if_streamed
from crackseg.model import distributed
from crackseg.model.inference import Predictor
from crackseg.core.digest import model_file_digest
from crackseg.model.runtimes import Runtime, RuntimeChoice, choose_runtime, load_runtime
from crackseg.model.shipped import DEFAULT_MODEL, SHIPPED, shipped_folder
from crackseg.prediction.engines import ENGINES, Engine
from crackseg.prediction.options import PredictOptions
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, Records
from crackseg.prediction.report import write_report
from crackseg.prediction.streamed import Raster, RasterRun, allow_open_rasters
from crackseg.prediction.work import Job, Plan

# Cracks cover a few percent of a crack photo's pixels: 1.6 % of CrackForest's mask pixels (6.3 % in its most cracked
# photo), 2.8 % of a 377-photo crack500 subset's (9.5 % at most). A run with more than a quarter of its pixels "crack",
# several times the most cracked photo, or with many photos mostly "crack", shows a model that does not fit the photos,
# not cracks: see crack_fraction_warning.
IMPLAUSIBLE_CRACK_FRACTION = 0.25  # of all predicted pixels
MOSTLY_CRACK = 0.5  # an image with more than this fraction of crack pixels is mostly crack
IMPLAUSIBLE_MOSTLY_CRACK_SHARE = 0.1  # of the images: at least this share mostly crack
_WITHOUT_LOCK = "pass --no-lock to go on without the guard (and run one predict per --out at a time)"


def predict_folder(checkpoint: Path | None, inputs: list[str], options: PredictOptions) -> int:
    """Predict every input into ``options.out`` with ``checkpoint`` (None: the shipped default model, said in one line
    once the inputs are found); returns 0, or 1 when some input failed.

    Under torchrun each process takes every WORLD_SIZE-th photo and a share of every raster's
    tile rows; rank 0 joins the rasters' parts, measures them and writes the tables.
    """
    notice = None
    if checkpoint is None:
        checkpoint = shipped_folder(DEFAULT_MODEL)
        notice = f"crackseg: no --checkpoint: predicting with the shipped {DEFAULT_MODEL} model ({SHIPPED[DEFAULT_MODEL].terms})"
    choice = choose_runtime(Path(checkpoint), options.inference)
    env = distributed.setup(choice.device)
    try:
        with contextlib.ExitStack() as cleanup:
            return _predict(choice, inputs, options, env, cleanup, notice)
    finally:
        distributed.teardown()


def _predict(choice: RuntimeChoice, inputs: list[str], options: PredictOptions, env: distributed.Environment,
             cleanup: contextlib.ExitStack, notice: str | None) -> int:
    engine = ENGINES[options.engine].load()
    engine.check(env)
    plan = _plan(inputs, options, cleanup)
    runtime = load_runtime(choice, engine.model_device(env))  # a model file that is refused leaves no --out folder behind
    threshold = runtime.threshold if options.threshold is None else options.threshold
    plan = plan.marked(_made_with(choice, threshold))
    if notice and env.is_main:
        print(notice, file=sys.stderr)
    listed = distributed.decided_on_main(env, _prepare, plan, options)
    if not env.is_main:
        plan.staged.prepare(existing=listed)  # rank 0's listing, for every process's --skip-existing
    return _run(engine, Job(plan, _raster_run(plan, runtime, threshold, options), choice, options, env, Records()))


def _made_with(choice: RuntimeChoice, threshold: float) -> str:
    """What decides a run's masks, written into each (so that --skip-existing keeps no mask another way made): the
    model file's contents, the threshold, and how photos are tiled, flipped and resized."""
    inference = choice.options
    return json.dumps({"model": f"sha256 {model_file_digest(choice.path)[:16]}", "threshold": threshold,  # a copy is the same model
                       "tile": inference.tile, "overlap": inference.overlap, "tta": inference.tta, "resize": inference.resize})


def _prepare(plan: Plan, options: PredictOptions) -> set[str]:
    """The folder prepared (see :meth:`PredictionsFolder.prepare`); under --skip-existing, masks an earlier run made
    with other settings are refused before any work."""
    listed = plan.folder.prepare(plan.staged, list(plan.outputs.values()), options.overwrite, options.skip_existing)
    if options.skip_existing:
        plan.refuse_masks_made_otherwise()
    return listed


def _raster_run(plan: Plan, runtime: Runtime, threshold: float, options: PredictOptions) -> RasterRun:
    predictor = Predictor(runtime.model, runtime.device, options.inference, runtime.amp_dtype)
    return RasterRun(predictor, threshold, plan.folder, options.save_prob, options.overviews, plan.spec.made_with)


def _run(engine: Engine, job: Job) -> int:
    plan, env, records = job.plan, job.env, job.records
    if env.is_main:
        for warning in plan.warnings:
            print(f"crackseg: warning: {warning}", file=sys.stderr)
    try:
        engine.run(job)
        for row in records.rows.values():  # each process names its own staged masks as --out holds them
            row["mask"] = plan.staged.shown(row["mask"])
        gathered = Records.joined(distributed.gather_objects(records, env))
        return _write_tables(plan, gathered, job.options, job.run.threshold) if env.is_main else 0
    except OutFailed as error:
        raise plan.unfinished(error) from None


def _plan(inputs: list[str], options: PredictOptions, cleanup: contextlib.ExitStack) -> Plan:
    """List the inputs, open each raster (kept open in ``cleanup`` until it is predicted), and
    resolve every input's outputs: sizes, pixel types and units are checked before any work."""
    out = Path(options.out)  # an s3:// URL names no local folder here
    if (out / "images").is_dir() and (out / "masks").is_dir() and not (out / "predictions.csv").is_file():
        raise InputError(f"--out {options.out}: a dataset (images/ and masks/), whose masks predict's would mix with; "
                         "choose a folder of its own")
    staged = cleanup.enter_context(StagedFolder(options.out, "predict", "predictions", options.lock, _WITHOUT_LOCK))
    folder = PredictionsFolder(staged.root)
    listed, left_out = collect_inputs(inputs, options.recursive, options.out)
    tiffs = sum(path.suffix.lower() in (".tif", ".tiff") for path, _ in listed)
    if tiffs and importlib.util.find_spec("rasterio") is not None:  # without it, open_if_streamed says what a raster needs
        cleanup.enter_context(gdal_settings())
        allow_open_rasters(tiffs)
    sources, unplaced = {}, []  # georeferencing no output carries
    for key, (path, _) in enumerate(listed):
        source, note = open_if_streamed(path, options.max_pixels)
        unplaced += [note] if note else []
        if source is not None:
            cleanup.callback(source.close)
            sources[key] = source
    if sources and options.inference.resize is not None:  # before any photo is predicted, not at each raster's turn
        raise InputError(f"{listed[next(iter(sources))][0]}: --resize cannot be used with rasters predicted by windows (GeoTIFFs, "
                         "TIFFs with nodata, transparency or too large to hold whole); leave it out, or predict the rasters in a run of their own")
    # a raster's own pixel size in mm, or None; why a georeferenced raster has none; which were measured on the ground
    scales, notes, on_ground = {}, {}, []
    for key, source in sources.items():
        scales[key], note = source.px_size_mm()
        if note and options.scale.px_size is None:
            if scales[key] is None:
                notes[key] = note
            else:
                on_ground.append(note)
    spec, raster_specs = _output_specs(listed, scales, notes, options)
    rasters = [Raster(key, listed[key][0], listed[key][1], source, raster_specs[key]) for key, source in sources.items()]
    photos = [(key, path, name) for key, (path, name) in enumerate(listed) if key not in sources]
    outputs = {key: folder.outputs(name, raster_specs.get(key, spec), raster=key in sources) for key, (_, name) in enumerate(listed)}
    _refuse_files_in_the_way(listed, outputs, staged.shown)
    warnings = [f"{note}; lengths stay in px (give --px-size)" for note in notes.values()] + on_ground + unplaced + list(dict.fromkeys(w for s in (spec, *raster_specs.values()) for w in _resolution_warnings(s)))
    warnings += _left_out_warning(left_out)
    return Plan(folder, staged, photos, rasters, spec, outputs, warnings, options.skip_existing)


def _write_tables(plan: Plan, records: Records, options: PredictOptions, threshold: float) -> int:
    """predictions.csv, cracks.csv, errors.csv, summary.json and the report; returns the exit status."""
    folder, show = plan.folder, plan.staged.shown
    implausible = crack_fraction_warning(list(records.rows.values()), threshold)
    if implausible:
        print(f"crackseg: warning: {implausible}", file=sys.stderr)
    warnings = plan.warnings + ([implausible] if implausible else [])
    summary = folder.write_tables(records, plan.spec, warnings, options.overwrite, threshold)
    names, kept = set(), set()
    if options.overwrite:  # what an earlier run wrote and this one did not would pass for this run's
        names = folder.earlier_names | {folder.name_of(paths[0]) for paths in plan.outputs.values()}
        kept = {path for key in records.rows for path in plan.outputs[key]}
    plan.staged.remove(folder.superseded(names, kept))
    if options.report:
        write_report(folder.root)
    plan.staged.finish()
    print(f"{len(records.rows)} images predicted into {show(folder.root)}"
          + (f"; {len(records.errors)} failed, listed in {show(folder.errors_csv)}" if records.errors else ""))
    if plan.spec.measure:
        print(_summary_line(summary))
    if options.report:
        print(f"report written to {show(folder.report_html)}")
    return 1 if records.errors else 0


def _output_specs(listed: list[tuple[Path | RemoteFile, str]], scales: dict[int, float | None], notes: dict[int, str],
                  options: PredictOptions) -> tuple[OutputSpec, dict[int, OutputSpec]]:
    """The run's spec (photos and the summary) and each raster's, with the raster's own scale unless --px-size is given.

    Width classes and lengths in mm need a scale for every image; the run's scale is --px-size,
    or the one scale all inputs share when every input is a raster that carries it.
    """
    needed_by = options.scale_needed_by()
    if needed_by and options.scale.px_size is None:
        for key, (path, _) in enumerate(listed):
            if key in notes:
                raise InputError(f"{needed_by} needs the pixel size in mm: give --px-size ({notes[key]})")
            if scales.get(key) is None:
                kind = "a photo" if key not in scales else "a raster without a projected, square-pixel georeferencing"
                raise InputError(f"{needed_by} needs the pixel size in mm: give --px-size ({path} is {kind}, which carries none)")
    own = set(scales.values())
    common = own.pop() if len(own) == 1 and len(scales) == len(listed) else None
    return OutputSpec.of(options, common), {key: OutputSpec.of(options, scale) for key, scale in scales.items()}


def _refuse_files_in_the_way(listed: list[tuple[Path | RemoteFile, str]], outputs: dict[int, list[Path]],
                             shown: Callable[[Path], str]) -> None:
    """Before any work: an output file where another input's outputs need a folder (a.jpg's masks/a.png, and
    a.png/b.jpg's masks/a.png/b.png under --recursive) would end the run midway."""
    owner = {path: key for key, paths in outputs.items() for path in paths}
    for key, paths in outputs.items():
        for parent in (parent for path in paths for parent in path.parents if parent in owner):
            raise InputError(f"{listed[owner[parent]][0]} and {listed[key][0]}: the first one's output {shown(parent)} is the folder "
                             "the second one's outputs go in; rename one, or predict them into different --out folders")


def _left_out_warning(left_out: list[Path | RemoteFile]) -> list[str]:
    """A warning naming the photos a folder holds in formats predict does not read, if any."""
    if not left_out:
        return []
    named = ", ".join(map(str, left_out[:3])) + (f" and {len(left_out) - 3} more" if len(left_out) > 3 else "")
    return [f"{len(left_out)} photo(s) in a format predict does not read were left out ({named}): "
            "convert them to PNG, JPEG or TIFF, or name such a file alone to have Pillow try it"]


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
