"""The predictions folder: what ``predict`` writes for each image and for the whole run.

Per image: ``masks/<name>.png`` (the model's pixels, 0/255), optionally ``probs/<name>.png`` and ``overlays/<name>.jpg``
(the photo with each reported crack tinted and labelled with its id), ``vectors/<name>.geojson|gpkg``, a row of
``predictions.csv`` and, when measuring, one row of ``cracks.csv`` per crack; a raster predicted by windows gets ``.tif``
masks and probabilities. For the run: ``summary.json`` (totals, the widest crack, length per width
class), ``errors.csv`` when an input failed, and ``report.html`` with its pictures under
``report/``. :class:`PredictionsFolder` is the one place that names these files, and the one
writer and reader of its tables.

Cracks are what :func:`crackseg.cracks.measure.find_cracks` reports: pieces joined across short
gaps, specks under the minimum length left out of the tables and overlays (the mask keeps
every pixel the model marked).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from tqdm import tqdm

from crackseg.core.errors import InputError
from crackseg.core.files import read_csv, remove_orphan_temps, write_atomic, write_csv
from crackseg.core.urls import is_url
from crackseg.cracks.measure import find_cracks, find_cracks_with_skeleton
from crackseg.cracks.vectors import FORMATS, centrelines, layer_files, skeleton_links, sqlite_logs, write_vectors
from crackseg.cracks.widths import WidthClasses
from crackseg.data.images import DECODE_ERRORS, crack_mask, describe_error
from crackseg.data.rasters import raster_tag
from crackseg.prediction.pictures import MADE_WITH, overlay_jpeg, probability_levels, write_png
from crackseg.prediction.tables import mask_counts, table_columns, table_rows, write_summary
from crackseg.prediction.uncertainty import uncertainty

if TYPE_CHECKING:
    import torch

    from crackseg.core.staging import StagedFolder
    from crackseg.prediction.options import PredictOptions

REPORT_PICTURES = ("thumbs", "photos", "overlays")  # report/<kind>/<name>.jpg


@dataclass(frozen=True)
class OutputSpec:
    """Which files to write and how to measure, resolved to pixels."""

    save_prob: int | None = None  # 8 or 16 bits
    overlay: bool = False
    measure: bool = True
    px_size: float | None = None  # mm per pixel
    join_gap_px: float | None = 0.0  # None: given in mm, and there is no pixel size to convert it
    min_length_px: float | None = 0.0
    width_classes: WidthClasses | None = None
    vectors: str | None = None  # geojson or gpkg: crack centrelines per image
    made_with: str = ""  # what decides the masks (model, threshold, tiling), written into each: see saved_made_with

    @classmethod
    def of(cls, options: PredictOptions, image_px_size: float | None = None) -> OutputSpec:
        """An image's outputs, lengths in pixels: mm are converted with --px-size, else with the image's own scale.

        Without either, a length in mm stays None: such an image is never measured.
        """
        scale = options.scale
        px_size = scale.px_size if scale.px_size is not None else image_px_size
        return cls(options.save_prob, options.overlay, options.measure, px_size, options.join_gap.pixels(px_size),
                   options.min_length.pixels(px_size), scale.classes(), options.vectors)


class PredictionsFolder:
    """The layout of a predictions folder: every path predict, report and the raster code use, its preparation,
    and its tables written and read back."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.predictions_csv = self.root / "predictions.csv"
        self.cracks_csv = self.root / "cracks.csv"
        self.errors_csv = self.root / "errors.csv"
        self.summary_json = self.root / "summary.json"
        self.report_html = self.root / "report.html"
        self.report_pictures = self.root / "report"
        self.rank_csv = self.root / "rank.csv"  # crackseg labels rank
        self.tables = [self.predictions_csv, self.cracks_csv, self.errors_csv, self.summary_json, self.report_html, self.rank_csv]
        self.earlier_names: set[str] = set()  # under --overwrite: the names the predictions.csv found here listed

    def mask(self, name: str, raster: bool = False) -> Path:
        return self.root / "masks" / f"{name}{'.tif' if raster else '.png'}"

    def probabilities(self, name: str, raster: bool = False) -> Path:
        return self.root / "probs" / f"{name}{'.tif' if raster else '.png'}"

    def overlay(self, name: str) -> Path:
        return self.root / "overlays" / f"{name}.jpg"

    def vectors(self, name: str, fmt: str) -> Path:
        return self.root / "vectors" / f"{name}{FORMATS[fmt][1]}"

    def report_picture(self, kind: str, name: str) -> Path:
        return self.report_pictures / kind / f"{name}.jpg"

    def outputs(self, name: str, spec: OutputSpec, raster: bool = False) -> list[Path]:
        """The files one input gets: its mask first, then what the spec asks for (rasters get no overlay)."""
        paths = [self.mask(name, raster)]
        if spec.save_prob:
            paths.append(self.probabilities(name, raster))
        if spec.overlay and not raster:
            paths.append(self.overlay(name))
        if spec.vectors:
            paths += layer_files(self.vectors(name, spec.vectors))
        return paths

    def every_output(self, name: str) -> list[Path]:
        """Every file predict or report may have written for ``name``, whatever the options."""
        paths = [self.mask(name), self.mask(name, True), self.probabilities(name), self.probabilities(name, True), self.overlay(name)]
        paths += [path for fmt in FORMATS for path in layer_files(self.vectors(name, fmt))]
        paths += sqlite_logs(self.vectors(name, "gpkg"))  # what SQLite keeps beside a layer a program has open
        return paths + [self.report_picture(kind, name) for kind in REPORT_PICTURES]

    def superseded(self, names: set[str], kept: set[Path]) -> list[Path]:
        """What no longer matches the tables just written: the report of earlier ones, and the files of ``names`` but ``kept``."""
        paths = [self.report_html, self.report_pictures / "pr_curve.png"]
        return paths + [path for name in sorted(names) for path in self.every_output(name) if path not in kept]

    def name_of(self, mask: Path) -> str:
        """The output name of an input from its mask's path (sub-folders kept)."""
        masks = self.root / "masks"
        return mask.relative_to(masks).with_suffix("").as_posix() if mask.is_relative_to(masks) else mask.stem

    def prepare(self, staged: StagedFolder, outputs: list[list[Path]], overwrite: bool, skip_existing: bool) -> set[str]:
        """Before any work: ``staged`` (this folder's) prepared: its lock taken, on a store listed and the tables
        downloaded, to be written again as a local run writes them (errors.csv kept, rank.csv removed); nothing replaced
        unless asked; what an interrupted run left cleared. Returns the store's listing. The caller releases ``staged``."""
        if overwrite and skip_existing:
            raise InputError("--overwrite and --skip-existing contradict each other; choose one")
        listed = staged.prepare(lambda key: self.root / key in self.tables)
        try:
            wanted = [] if overwrite or skip_existing else [*(path for paths in outputs for path in paths), *self.tables]
            existing = [path for path in wanted if staged.existed(path)]
            if existing:
                raise InputError(f"{len(existing)} outputs already exist in {staged.shown()} (e.g. {staged.shown(existing[0])}); "
                                 "pass --skip-existing to keep them and finish the rest, or --overwrite to replace them")
            if skip_existing:
                self._refuse_tables_of_other_inputs(outputs)
        except BaseException:
            staged.release()
            raise
        for folder in [self.root, *(path for path in self.root.rglob("*") if path.is_dir())]:
            remove_orphan_temps(folder)
        self.earlier_names = self._listed_names() if overwrite else set()
        return listed

    def _refuse_tables_of_other_inputs(self, outputs: list[list[Path]]) -> None:
        """--skip-existing finishes a batch: the tables it writes list this run's inputs, so an earlier predictions.csv
        that lists others (whose rows they would drop, their masks left unlisted) is refused."""
        others = sorted(self._listed_names() - {self.name_of(paths[0]) for paths in outputs})
        if others:
            raise InputError(f"{self.predictions_csv} lists {len(others)} images this run does not predict (e.g. {others[0]}); "
                             "--skip-existing finishes a batch of the same inputs: give them too, choose another --out, or "
                             "pass --overwrite to replace the earlier run")

    def _listed_names(self) -> set[str]:
        """The output names predictions.csv lists; none from a row (or a table) that cannot be read: it is replaced."""
        try:
            rows = read_csv(self.predictions_csv) if self.predictions_csv.is_file() else []
        except (OSError, InputError):
            return set()
        names = set()
        for number, row in enumerate(rows, 1):
            with contextlib.suppress(InputError):
                names.add(self.name_of(self.table_path(row.get("mask") or "", "mask", number)))
        return names

    def write_tables(self, records: Records, spec: OutputSpec, warnings: list[str], overwrite: bool,
                     threshold: float | None = None) -> dict:
        """predictions.csv, cracks.csv (when measuring), errors.csv (when anything failed, or to clear an old one)
        and summary.json, from every process's records; returns the summary. A rank.csv of an earlier run is removed."""
        rows = [records.rows[key] for key in sorted(records.rows)]
        cracks = sorted(records.cracks, key=lambda r: (r["path"], r["crack"]))
        row_columns, crack_columns = table_columns(spec)  # the header of a table without rows; rows name their own
        write_csv(self.predictions_csv, rows, None if rows else row_columns)
        if spec.measure:
            write_csv(self.cracks_csv, cracks, None if cracks else crack_columns)
        else:
            self.cracks_csv.unlink(missing_ok=True)  # an earlier run's (--overwrite, --skip-existing): not this run's masks
        if records.errors or self.errors_csv.exists():
            write_csv(self.errors_csv, [records.errors[key] for key in sorted(records.errors)], ["path", "name", "error"])
        self.rank_csv.unlink(missing_ok=True)  # it ranked an earlier run's probabilities
        return write_summary(self, rows, records.cracks, spec, warnings, threshold)

    def read_predictions(self) -> list[dict]:
        """predictions.csv's rows, one per input, as text cells holding what predict wrote (names as given)."""
        if not self.predictions_csv.is_file():
            raise InputError(f"{self.predictions_csv}: not found; give a folder written by crackseg predict")
        return read_csv(self.predictions_csv, ("path", "mask"))

    def table_path(self, value: str, column: str, row: int) -> Path:
        """The file a path in predictions.csv's ``column`` (mask) names, which must lie inside this folder (under masks/).

        Predict wrote it from its own working folder (``OUT/masks/<name>.png``, OUT as given then), so what counts is
        what follows a ``masks`` component (without ``..``): the first such rest that exists, else the last. A value
        with no such rest, or whose file resolves outside the folder (through a link), is refused, naming the table,
        row (1 = the first below the header) and value: a table is data, and must not steer reads or writes elsewhere."""
        parts = Path(value).parts
        rests = [parts[index + 1 :] for index, part in enumerate(parts) if part == "masks" and index + 1 < len(parts)]
        paths = [self.root / "masks" / Path(*rest) for rest in rests if ".." not in rest]
        if not paths:
            raise InputError(f"{self.predictions_csv}: row {row}: {column} {value!r} does not name a file inside "
                             f"{self.root / 'masks'}; predictions.csv is predict's own: predict again rather than edit it")
        path = next((path for path in paths if path.exists()), paths[-1])
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise InputError(f"{self.predictions_csv}: row {row}: {column} {value!r} resolves to {path.resolve()}, not inside "
                             f"{self.root}; give the folder predict wrote, with its own files")
        return path

    def photo(self, written: str) -> Path:
        """The photo a predictions.csv path names: a relative one from the first of :attr:`_photo_roots` that holds it,
        named as written when that is the file or when none holds it (whoever reads it fails, naming it)."""
        path = Path(written)
        if path.is_absolute() or is_url(written):
            return path
        found = next((root / path for root in self._photo_roots if (root / path).exists()), path)
        return path if found != path and path.exists() and path.samefile(found) else found

    @functools.cached_property
    def _photo_roots(self) -> list[Path]:
        """The folder predict ran in (summary.json's ``working_folder``, read once), the current one, this one's parent."""
        try:
            return [Path(json.loads(self.summary_json.read_text())["working_folder"]), Path(), self.root.parent]
        except (OSError, ValueError, KeyError, TypeError):  # written before predict recorded it
            return [Path(), self.root.parent]

    def read_cracks(self) -> list[dict]:
        """cracks.csv's rows, one per crack, as text cells; none when predict did not measure (no cracks.csv)."""
        return read_csv(self.cracks_csv, ("path", "crack")) if self.cracks_csv.is_file() else []


def read_saved_mask(path: Path) -> np.ndarray:
    """(H, W) bool crack pixels of a mask PNG that predict wrote, read by the one mask reader (a one-line error if not)."""
    try:
        return crack_mask(path)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: predictions.csv names this mask: {describe_error(error)}; run predict again") from None


@dataclass
class Records:
    """What a process predicted: predictions.csv rows and errors.csv rows by input key, cracks.csv rows."""

    rows: dict[int, dict] = field(default_factory=dict)
    cracks: list[dict] = field(default_factory=list)
    errors: dict[int, dict] = field(default_factory=dict)

    def add(self, key: int, row: dict, cracks: list[dict]) -> None:
        self.rows[key] = row
        self.cracks += cracks

    def fail(self, key: int, path: Path, name: str, error: str, on_stderr: bool = True) -> None:
        """An input that failed: listed in errors.csv with its output name (which compare pairs it by), in the inputs'
        order whatever order they failed in, and said on stderr now (unless not ``on_stderr``)."""
        self.errors[key] = {"path": str(path), "name": name, "error": error}
        if on_stderr:
            tqdm.write(f"crackseg: error: {path}: {error}", file=sys.stderr)

    @staticmethod
    def joined(parts: list[Records]) -> Records:
        """Every process's records as one."""
        joined = Records()
        for part in parts:
            joined.rows |= part.rows
            joined.cracks += part.cracks
            joined.errors |= part.errors
        return joined


def predictions(predictor, photos, threshold: float, spec: OutputSpec):
    """(key, what :func:`write_image_outputs` needs of each photo) from a :class:`crackseg.model.inference.Predictor`:
    the probabilities when they are saved, else the masks, thresholded where the model runs."""
    return predictor.probabilities(photos) if spec.save_prob else predictor.masks(photos, threshold)


def write_image_outputs(folder: PredictionsFolder, path: Path, name: str, image: np.ndarray | torch.Tensor | None,
                        prediction: np.ndarray | torch.Tensor, threshold: float, spec: OutputSpec) -> tuple[dict, list[dict]]:
    """Write one photo's files (``image``: (3, H, W) uint8, needed for an overlay only; ``prediction``: (H, W) float32
    probabilities, or the bool mask they give at ``threshold``, which is all that is needed without ``spec.save_prob``);
    returns its predictions.csv row and cracks.csv rows.

    Runs in measuring processes and Ray's actors: numpy, not torch, does the per-pixel work, so that a
    process need not import torch nor start its intra-op pool.
    """
    prob = np.asarray(prediction)
    if prob.dtype == np.bool_ and spec.save_prob:
        raise ValueError("saving probabilities needs the probabilities, not the mask")
    mask = prob if prob.dtype == np.bool_ else prob >= threshold
    mask_path = folder.mask(name)
    write_png(mask_path, mask.astype(np.uint8) * 255, made_with=spec.made_with)
    counts = mask_counts(mask)
    if spec.save_prob:
        levels = probability_levels(prob, spec.save_prob)
        write_png(folder.probabilities(name), levels, probabilities=True)
        counts |= uncertainty(levels.astype(np.float32) / float(np.iinfo(levels.dtype).max), threshold)  # as rank reads the file
    labels, cracks, skeleton = find_cracks_with_skeleton(mask, spec.join_gap_px, spec.min_length_px) if spec.measure else (None, [], None)
    if spec.overlay:
        write_atomic(folder.overlay(name), overlay_jpeg(np.asarray(image).transpose(1, 2, 0), mask if labels is None else labels > 0, cracks))
    row, crack_rows = table_rows(path, mask_path, counts, cracks, spec, "ok")
    if spec.vectors:
        lines = centrelines(skeleton_links(skeleton > 0, skeleton))
        write_vectors(folder.vectors(name, spec.vectors), crack_rows, lines, None, spec.width_classes)
    return row, crack_rows


def saved_made_with(mask: Path) -> str | None:
    """What made a mask predict saved (a PNG's text, a GeoTIFF's tag :data:`~crackseg.prediction.pictures.MADE_WITH`):
    the JSON of the model's digest, the threshold and the tiling; None for a mask that does not say (written before
    masks said it) or cannot be read (the kept checks say why)."""
    if mask.suffix.lower() == ".tif":
        return raster_tag(mask, MADE_WITH)
    try:
        with Image.open(mask) as picture:
            return picture.info.get(MADE_WITH)
    except DECODE_ERRORS:
        return None


def summarize_existing(path: Path, mask_path: Path, spec: OutputSpec, unsure: dict) -> tuple[dict, list[dict]]:
    """The rows of an image whose outputs an earlier run wrote (``--skip-existing``), with ``unsure``: its
    :func:`~crackseg.prediction.uncertainty.uncertainty` where it saved probabilities, else {}."""
    mask = crack_mask(mask_path)  # a damaged one is predicted again, saying why
    counts = mask_counts(mask) | unsure
    cracks = find_cracks(mask, spec.join_gap_px, spec.min_length_px)[1] if spec.measure else []
    return table_rows(path, mask_path, counts, cracks, spec, "skipped: exists")
