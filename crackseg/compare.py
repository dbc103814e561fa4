"""``crackseg compare BEFORE AFTER``: what changed between two inspections of one structure.

Each side is a ``predict`` output folder or a dataset folder (``images/`` + ``masks/``);
images pair by their relative name, or by a CSV of before,after paths. Per pair: the two
are registered (map coordinates for georeferenced rasters, image features for photos), the
cracks of both dates are measured as ``predict`` measures them, and matched by their
centrelines (:mod:`crackseg.changes`). A pair that cannot be registered reliably is listed
as ``unregistered`` and not compared.

Written to ``--out``: ``changes.csv`` (a row per crack), ``pairs.csv`` (a row per pair,
and per image present on one side only), ``summary.json``; with ``--vectors`` a change
layer per pair, with ``--report`` report.html; with ``--register`` the site's crack register
(:mod:`crackseg.history`) is extended.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from crackseg import changes, history
from crackseg.config import JOIN_GAP, MIN_LENGTH, parse_length
from crackseg.data import find_samples
from crackseg.errors import InputError
from crackseg.files import ensure_writable_folder, remove_orphan_temps, write_atomic, write_csv
from crackseg.images import DECODE_ERRORS, displayed_size, load_image
from crackseg.locks import FolderLock
from crackseg.measure import WidthClasses
from crackseg.outputs import PredictionsFolder, read_saved_mask
from crackseg.rasters import RasterSource, rasterio
from crackseg.registration import UNREGISTERED, Alignment, align_by_map, register_photo_files
from crackseg.report import change_picture, write_change_report
from crackseg.vectors import FORMATS, centrelines, require_geo, skeleton_links, write_features

STATUSES = ("unchanged", "longer", "wider", "longer+wider", "merged", "split", "new", "gone")
MAX_MASK_PIXELS = 400_000_000  # masks are compared whole: about 10 bytes per pixel while measuring


@dataclass(frozen=True)
class CompareOptions:
    px_size: float | None = None  # mm per pixel of the AFTER photos (rasters: their own georeferencing)
    width_classes: str | None = None
    pairs: Path | None = None  # CSV of before,after paths
    vectors: str | None = None  # geojson or gpkg
    report: bool = False
    register: Path | None = None  # the site's GeoPackage
    dates: tuple[str | None, str | None] = (None, None)  # --before-date, --after-date
    transform: str = "similarity"  # the model photos are registered with
    overwrite: bool = False


@dataclass(frozen=True)
class Shot:
    """One image of one inspection: the name it pairs by, its mask, its photo, how its cracks were measured."""

    name: str
    mask: Path
    photo: Path | None
    join_gap_px: float
    min_length_px: float


@dataclass
class Side:
    """A shot's mask read whole, where its pixels lie on the map (rasters), and their size."""

    shot: Shot
    mask: np.ndarray
    georef: tuple[tuple, str] | None = None  # (geotransform, CRS)
    px_size_mm: float | None = None
    cracks: changes.DateCracks | None = None

    def lines(self) -> dict[int, object]:
        """Each crack's centreline: map coordinates for rasters, else the image's pixel coordinates."""
        skeleton = np.zeros(self.mask.shape, bool)
        for points in self.cracks.points.values():
            skeleton[points[:, 0], points[:, 1]] = True
        return centrelines(skeleton_links(skeleton, self.cracks.labels), self.georef[0] if self.georef else None)


@dataclass
class Comparison:
    """What ``compare`` found, gathered for the tables, the report and the register."""

    pairs: list[dict] = field(default_factory=list)
    changes: list[dict] = field(default_factory=list)
    register: tuple[list[dict], list[dict], list[dict]] = field(default_factory=lambda: ([], [], []))
    crs: set = field(default_factory=set)


def compare_inspections(before: Path, after: Path, out: Path, options: CompareOptions) -> dict:
    """Compare two inspections and write the outputs to ``out``; returns the summary."""
    classes = WidthClasses.parse(options.width_classes) if options.width_classes else None
    if options.vectors or options.register:
        require_geo()
    shots = read_visit(before, "BEFORE"), read_visit(after, "AFTER")
    paired, alone = pair_shots(*shots, options.pairs)
    dates = _survey_dates(shots, options.dates) if options.register else None
    outputs = CompareFolder(out, options.vectors)
    outputs.prepare(options.overwrite)
    try:
        found = Comparison()
        for index, (shot_before, shot_after) in enumerate(tqdm(paired, desc="compare", unit="pair", disable=len(paired) < 2)):
            _compare_pair(index, (shot_before, shot_after), options, classes, outputs, found)
        for side, shot in alone:
            found.pairs.append({"pair": len(found.pairs), f"name_{side}": shot.name, f"path_{side}": str(shot.photo or shot.mask),
                                "status": f"only {side}"})
        summary = _summary(before, after, found, options)
        write_csv(outputs.changes_csv, found.changes, CHANGE_COLUMNS)
        write_csv(outputs.pairs_csv, [{k: v for k, v in row.items() if not k.startswith("picture")} for row in found.pairs])
        write_atomic(outputs.summary_json, json.dumps(summary, indent=1) + "\n")
        if options.report:
            write_change_report(outputs.root, summary, found.pairs, found.changes)
        if options.register:
            if len(found.crs) > 1:
                raise InputError(f"--register {options.register}: the pairs lie in several CRSs or mix photos and rasters ({', '.join(sorted(map(str, found.crs)))})")
            sources = [str(Path(before).resolve()), str(Path(after).resolve())]
            summary["register"] = history.append_comparison(
                options.register, history.Survey(dates[0], sources[0]), history.Survey(dates[1], sources[1]),
                found.register[:2], found.register[2], next(iter(found.crs), None))
            write_atomic(outputs.summary_json, json.dumps(summary, indent=1) + "\n")
    finally:
        outputs.release()
    return summary


CHANGE_COLUMNS = ["path_before", "path_after", "crack_before", "crack_after", "status", "length_px_before", "length_px_after",
                  "mean_width_px_before", "mean_width_px_after", "max_width_px_before", "max_width_px_after"]


class CompareFolder:
    """The files of a comparison folder, and its preparation (one compare at a time, nothing replaced unasked)."""

    def __init__(self, root: Path, vectors: str | None):
        self.root = Path(root)
        self.changes_csv, self.pairs_csv = self.root / "changes.csv", self.root / "pairs.csv"
        self.summary_json, self.report_html = self.root / "summary.json", self.root / "report.html"
        self.vectors_format = vectors
        self._lock = FolderLock(self.root, "comparison", "--out")

    def vectors(self, name: str) -> Path:
        return self.root / "vectors" / f"{name}{FORMATS[self.vectors_format][1]}"

    def picture(self, index: int, side: str) -> Path:
        return self.root / "report" / f"pair{index}-{side}.jpg"

    def prepare(self, overwrite: bool) -> None:
        ensure_writable_folder(self.root, "--out")
        self._lock.acquire()
        existing = [path for path in (self.changes_csv, self.pairs_csv, self.summary_json, self.report_html) if path.exists()]
        if existing and not overwrite:
            self._lock.release()
            raise InputError(f"{existing[0]} already exists; choose another --out or pass --overwrite")
        for folder in (self.root, self.root / "vectors", self.root / "report"):
            if folder.is_dir():
                remove_orphan_temps(folder)

    def release(self) -> None:
        self._lock.release()


def read_visit(folder: Path, flag: str) -> list[Shot]:
    """The shots of one inspection: a predictions folder (predictions.csv) or a dataset (images/ + masks/)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{flag} {folder}: not a folder")
    predictions = PredictionsFolder(folder)
    if predictions.predictions_csv.exists():
        shots = _predicted_shots(predictions)
    elif (folder / "images").is_dir() and (folder / "masks").is_dir():
        gap, shortest = parse_length(JOIN_GAP)[0], parse_length(MIN_LENGTH)[0]
        shots = [Shot(sample.stem, sample.mask, sample.image, gap, shortest) for sample in find_samples(folder / "images", folder / "masks")[0]]
    else:
        raise InputError(f"{flag} {folder}: neither a predictions folder (predictions.csv) nor a dataset (images/ and masks/)")
    if not shots:
        raise InputError(f"{flag} {folder}: no image with a mask in it")
    return shots


def _predicted_shots(folder: PredictionsFolder) -> list[Shot]:
    try:
        summary = json.loads(folder.summary_json.read_text())
    except (OSError, ValueError):
        summary = {}
    gap = summary.get("join_gap_px") if summary.get("join_gap_px") is not None else parse_length(JOIN_GAP)[0]
    shortest = summary.get("min_length_px") if summary.get("min_length_px") is not None else parse_length(MIN_LENGTH)[0]
    with open(folder.predictions_csv, newline="") as file:
        rows = list(csv.DictReader(file))
    shots = []
    for row in rows:
        parts = Path(row.get("mask") or "").parts
        if "masks" not in parts:
            raise InputError(f"{folder.predictions_csv}: a row without a mask under masks/ ({row.get('path')!r})")
        relative = Path(*parts[len(parts) - parts[::-1].index("masks"):])
        photo = Path(row["path"]) if row.get("path") else None
        shots.append(Shot(relative.with_suffix("").as_posix(), folder.root / "masks" / relative, photo, float(gap), float(shortest)))
    return shots


def pair_shots(before: list[Shot], after: list[Shot], pairs_csv: Path | None) -> tuple[list[tuple[Shot, Shot]], list[tuple[str, Shot]]]:
    """The pairs to compare and the shots present on one side only, as ("before" | "after", shot)."""
    if pairs_csv is None:
        by_name = {shot.name: shot for shot in after}
        paired = [(shot, by_name[shot.name]) for shot in before if shot.name in by_name]
    else:
        paired = _listed_pairs(before, after, Path(pairs_csv))
    if not paired:
        raise InputError(f"nothing pairs: BEFORE has {_names(before)} and AFTER has {_names(after)}; "
                         "give --pairs CSV (before,after) when names differ between visits")
    used = {id(shot) for pair in paired for shot in pair}
    alone = [("before", shot) for shot in before if id(shot) not in used] + [("after", shot) for shot in after if id(shot) not in used]
    return paired, alone


def _names(shots: list[Shot]) -> str:
    return ", ".join(shot.name for shot in shots[:3]) + (f" and {len(shots) - 3} more" if len(shots) > 3 else "")


def _listed_pairs(before: list[Shot], after: list[Shot], path: Path) -> list[tuple[Shot, Shot]]:
    """Pairs from a CSV with the columns before,after: each a photo path or a shot's name."""
    try:
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
    except OSError as error:
        raise InputError(f"--pairs {path}: {error.strerror or error}") from None
    if not rows or not {"before", "after"} <= set(rows[0]):
        raise InputError(f"--pairs {path}: needs a header line 'before,after' and one row per pair")

    def find(shots: list[Shot], text: str, side: str, line: int) -> Shot:
        wanted = Path(text)
        for shot in shots:
            if text == shot.name or (shot.photo is not None and (wanted == shot.photo or wanted.name == shot.photo.name)):
                return shot
        raise InputError(f"--pairs {path}, line {line}: {text!r} is not an image of {side.upper()}")

    return [(find(before, row["before"], "before", line), find(after, row["after"], "after", line)) for line, row in enumerate(rows, 2)]


def _survey_dates(shots: tuple[list[Shot], list[Shot]], given: tuple[str | None, str | None]) -> tuple[str, str]:
    """Each inspection's date: the flag, else the earliest EXIF DateTimeOriginal of its photos."""
    dates = []
    for side, visit, date in zip(("before", "after"), shots, given):
        if date is None:
            taken = [day for shot in visit if shot.photo is not None and (day := _exif_day(shot.photo))]
            if not taken:
                raise InputError(f"--register needs the {side.upper()} inspection's date: its photos carry no EXIF DateTimeOriginal; "
                                 f"give --{side}-date YYYY-MM-DD")
            date = min(taken)
        dates.append(date)
    return dates[0], dates[1]


def _exif_day(photo: Path) -> str | None:
    try:
        with Image.open(photo) as image:
            taken = image.getexif().get_ifd(0x8769).get(36867)  # Exif IFD, DateTimeOriginal "YYYY:MM:DD HH:MM:SS"
        return dt.datetime.strptime(str(taken).strip()[:10], "%Y:%m:%d").date().isoformat() if taken else None
    except (*DECODE_ERRORS, ValueError):
        return None


def _compare_pair(index: int, shots: tuple[Shot, Shot], options: CompareOptions, classes: WidthClasses | None,
                  outputs: CompareFolder, found: Comparison) -> None:
    row = {"pair": index, "name_before": shots[0].name, "name_after": shots[1].name,
           "path_before": str(shots[0].photo or shots[0].mask), "path_after": str(shots[1].photo or shots[1].mask)}
    try:
        sides = _load_side(shots[0]), _load_side(shots[1])
    except InputError as error:  # an unreadable mask fails its pair, not the comparison
        found.pairs.append(row | {"status": "failed", "reason": str(error)})
        return
    alignment = _align(sides, options.transform)  # rasters in two CRSs: the whole comparison is wrong, stop in one line
    row |= {"status": alignment.status, "method": alignment.method, "inliers": alignment.inliers,
            "residual_px": None if alignment.residual_px is None else round(alignment.residual_px, 3),
            "error_px": round(alignment.error_px, 3), "reason": alignment.reason}
    if not alignment.registered:
        found.pairs.append(row)
        return
    for side in sides:
        side.cracks = changes.measure_date(side.mask, side.shot.join_gap_px, side.shot.min_length_px)
    tolerance = changes.MATCH_TOLERANCE_PX + alignment.error_px
    matched = changes.match(sides[0].cracks, sides[1].cracks, alignment, tolerance)
    rows = [_change_row(row, change, sides, options.px_size, classes) for change in matched]
    counts = {status: sum(r["status"] == status for r in rows) for status in STATUSES}
    row |= counts | {"length_px_before": round(sum(c.length_px for c in sides[0].cracks.cracks), 2),
                     "length_px_after": round(sum(c.length_px for c in sides[1].cracks.cracks), 2)}
    found.pairs.append(row)
    found.changes += [r | {"pair": index} for r in rows]
    if options.vectors or options.register:
        lines = sides[0].lines(), sides[1].lines()
        if options.vectors:
            _write_change_layer(outputs, sides, matched, rows, lines, alignment)
        if options.register:
            _add_to_register(found, sides, matched, lines)
    if options.report:
        row |= _pictures(outputs, index, sides, matched)


def _load_side(shot: Shot) -> Side:
    """The shot's mask as crack pixels, with the georeferencing of the mask (or of its image, for PNG masks)."""
    georeferenced = next((path for path in (shot.mask, shot.photo) if path is not None and path.suffix.lower() in (".tif", ".tiff")
                          and path.exists() and _has_crs(path)), None)
    if shot.mask.suffix.lower() in (".tif", ".tiff"):
        rio = rasterio()
        with rio.open(shot.mask) as raster:
            if raster.width * raster.height > MAX_MASK_PIXELS:
                raise InputError(f"{shot.mask}: {raster.width * raster.height / 1e6:,.0f} megapixels; compare reads masks whole, "
                                 f"up to {MAX_MASK_PIXELS / 1e6:,.0f}")
            mask = raster.read(1) > 127
    else:
        try:
            mask = read_saved_mask(shot.mask)
        except (*DECODE_ERRORS, ValueError) as error:
            raise InputError(f"{shot.mask}: not a readable mask ({error})") from None
    if georeferenced is None:
        return Side(shot, mask)
    with RasterSource(georeferenced, max_pixels=MAX_MASK_PIXELS) as source:
        if (source.height, source.width) != mask.shape:
            raise InputError(f"{shot.mask}: {mask.shape[1]}x{mask.shape[0]} px, but {georeferenced} is {source.width}x{source.height}")
        return Side(shot, mask, (tuple(source.transform)[:6], source.crs.to_string()), source.px_size_mm()[0])


def _has_crs(path: Path) -> bool:
    with rasterio().open(path) as raster:
        return raster.crs is not None and not raster.transform.is_identity


def _align(sides: tuple[Side, Side], transform: str) -> Alignment:
    before, after = sides
    if before.georef and after.georef:
        return align_by_map(before.georef, after.georef)
    if before.georef or after.georef:
        return Alignment(status=UNREGISTERED, method="none", reason="one side is georeferenced and the other is not")
    for side in sides:
        if side.shot.photo is None or not side.shot.photo.exists():
            return Alignment(status=UNREGISTERED, method="none", reason=f"photo not found: {side.shot.photo}")
        try:
            with Image.open(side.shot.photo) as image:
                size = displayed_size(image)
        except DECODE_ERRORS as error:
            return Alignment(status=UNREGISTERED, method="none", reason=f"{side.shot.photo}: not readable ({error})")
        if size != (side.mask.shape[1], side.mask.shape[0]):
            return Alignment(status=UNREGISTERED, method="none",
                             reason=f"{side.shot.mask} is {side.mask.shape[1]}x{side.mask.shape[0]} px, its photo {size[0]}x{size[1]}")
    return register_photo_files(before.shot.photo, after.shot.photo, transform)


def _change_row(pair: dict, change: changes.Change, sides: tuple[Side, Side], px_size: float | None,
                classes: WidthClasses | None) -> dict:
    """A row of changes.csv: the crack's ids, status and measurements of both dates, its box in the AFTER image."""
    row = {"path_before": pair["path_before"], "path_after": pair["path_after"],
           "crack_before": change.before.id if change.before else None, "crack_after": change.after.id if change.after else None,
           "status": change.status}
    # mm per pixel of each date: rasters their own; photos the AFTER pixel size given, the BEFORE pixels through the registration's scale
    before_mm = sides[0].px_size_mm if sides[0].georef else (px_size * change.scale if px_size else None)
    after_mm = sides[1].px_size_mm if sides[1].georef else px_size
    for when, crack, mm in (("before", change.before, before_mm), ("after", change.after, after_mm)):
        for key in ("length", "mean_width", "max_width"):
            value = getattr(crack, f"{key}_px") if crack else None
            row[f"{key}_px_{when}"] = None if value is None else round(value, 3)
            if mm is not None:
                row[f"{key}_mm_{when}"] = None if value is None else round(value * mm, 4)
    if classes is not None and before_mm is not None and after_mm is not None:
        before_class = classes.classify(row["max_width_mm_before"]) if change.before else None
        after_class = classes.classify(row["max_width_mm_after"]) if change.after else None
        row |= {"max_width_class_before": before_class, "max_width_class_after": after_class,
                "class_changed": bool(before_class and after_class and before_class != after_class)}
    top, left, bottom, right = change.box_after
    row |= {"top": top, "left": left, "bottom": bottom, "right": right}
    if sides[1].georef:
        a, b, c, d, e, f = sides[1].georef[0]
        xs, ys = zip(*((a * x + b * y + c, d * x + e * y + f) for y in (top, bottom) for x in (left, right)))
        row |= {"x_min": min(xs), "y_min": min(ys), "x_max": max(xs), "y_max": max(ys)}
    return row


def _write_change_layer(outputs: CompareFolder, sides: tuple[Side, Side], matched: list[changes.Change], rows: list[dict],
                        lines: tuple[dict, dict], alignment: Alignment) -> None:
    """The pair's change layer: AFTER centrelines with their status; gone cracks with their BEFORE centreline, in the AFTER frame."""
    import shapely

    def into_after(x: np.ndarray) -> np.ndarray:  # BEFORE pixel-centre (x, y) -> AFTER
        rows_cols = alignment.map_points(np.column_stack([x[:, 1] - 0.5, x[:, 0] - 0.5]))
        return np.column_stack([rows_cols[:, 1] + 0.5, rows_cols[:, 0] + 0.5])

    geometries = []
    for change in matched:
        if change.after is not None:
            geometries.append(lines[1][change.after.id])
        elif sides[0].georef:
            geometries.append(lines[0][change.before.id])  # map coordinates already
        else:
            geometries.append(shapely.transform(lines[0][change.before.id], into_after))
    crs = sides[1].georef[1] if sides[1].georef else None
    write_features(outputs.vectors(sides[1].shot.name), outputs.vectors_format, rows, geometries, crs, "changes")


def _add_to_register(found: Comparison, sides: tuple[Side, Side], matched: list[changes.Change], lines: tuple[dict, dict]) -> None:
    """The pair's cracks of both dates and the links between them, for the site's register."""
    found.crs.add(sides[1].georef[1] if sides[1].georef else None)
    for side, (records, crack_lines) in zip(sides, zip(found.register[:2], lines)):
        for crack in side.cracks.cracks:
            record = {"image": side.shot.name, "crack": crack.id, "length_px": crack.length_px, "mean_width_px": crack.mean_width_px,
                      "max_width_px": crack.max_width_px, "geometry": crack_lines[crack.id]}
            if side.px_size_mm:
                record |= {f"{key}_mm": getattr(crack, f"{key}_px") * side.px_size_mm for key in ("length", "mean_width", "max_width")}
            records.append(record)
    found.register[2].extend(
        {"before_image": sides[0].shot.name, "before_crack": change.before.id, "after_image": sides[1].shot.name,
         "after_crack": change.after.id, "status": change.status}
        for change in matched if change.before is not None and change.after is not None)


def _pictures(outputs: CompareFolder, index: int, sides: tuple[Side, Side], matched: list[changes.Change]) -> dict:
    """Both photos with their cracks coloured by status, for the report (none for rasters: too large to picture whole)."""
    if sides[0].georef or sides[1].georef:
        return {"picture_before": None, "picture_after": None}
    statuses = ({c.before.id: c.status for c in matched if c.before}, {c.after.id: c.status for c in matched if c.after})
    names = {}
    for side, when, colours in zip(sides, ("before", "after"), statuses):
        photo = load_image(side.shot.photo).permute(1, 2, 0).numpy()
        path = outputs.picture(index, when)
        write_atomic(path, change_picture(photo, side.cracks.labels, colours))
        names[f"picture_{when}"] = path.relative_to(outputs.root).as_posix()
    return names


def _summary(before: Path, after: Path, found: Comparison, options: CompareOptions) -> dict:
    pairs = [row for row in found.pairs if row["status"] in ("registered", "unregistered", "failed")]
    return {
        "before": str(before), "after": str(after),
        "pairs": len(pairs),
        "registered": sum(row["status"] == "registered" for row in pairs),
        "unregistered": [row["name_after"] for row in pairs if row["status"] != "registered"],
        "only_before": [row["name_before"] for row in found.pairs if row["status"] == "only before"],
        "only_after": [row["name_after"] for row in found.pairs if row["status"] == "only after"],
        "cracks": {status: sum(row["status"] == status for row in found.changes) for status in STATUSES},
        "px_size_mm": options.px_size,
        "tolerance_px": changes.MATCH_TOLERANCE_PX,
        "transform": options.transform,
    }
