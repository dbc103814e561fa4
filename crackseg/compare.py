"""``crackseg compare BEFORE AFTER``: what changed between two inspections of one structure.

Each side is a ``predict`` output folder or a dataset folder (``images/`` + ``masks/``);
images pair by their relative name, or by a CSV of before,after paths. Per pair: the two
are registered (map coordinates for georeferenced rasters, image features for photos), the
cracks of both dates are measured as ``predict`` measures them, and matched by their
centrelines (:mod:`crackseg.changes`). A pair that cannot be registered reliably is listed
as ``unregistered`` and not compared; a pair whose files cannot be read is listed as
``failed`` with the reason, and the other pairs go on. Rasters in two CRSs stop the run:
every pair would be compared in the wrong place.

Written to ``--out``: ``changes.csv`` (a row per crack), ``pairs.csv`` (a row per pair,
and per image present on one side only), ``summary.json``; with ``--vectors`` a change
layer per pair, with ``--report`` report.html; with ``--register`` the site's crack register
(:mod:`crackseg.history`) is extended. What can be refused is refused before any work.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from crackseg import changes, history
from crackseg.errors import InputError, require
from crackseg.files import ensure_writable_folder, remove_orphan_temps, write_atomic, write_csv
from crackseg.images import CRACK_THRESHOLD, DECODE_ERRORS, describe_error, displayed_size, image_pixels, is_zero_one
from crackseg.inspections import Shot, pair_shots, read_visit, survey_dates
from crackseg.locks import FolderLock
from crackseg.measure import WidthClasses
from crackseg.outputs import read_saved_mask
from crackseg.rasters import RasterSource, on_map, rasterio
from crackseg.registration import UNREGISTERED, Alignment, align_by_map, register_photo_files
from crackseg.report import STATUS_COLOURS, change_picture, write_change_report
from crackseg.vectors import FORMATS, centrelines, skeleton_links, write_features

FAILED = "failed"
ONLY_BEFORE, ONLY_AFTER = "only before", "only after"
PAIR_FAILURES = (InputError, OSError)  # a file of one pair that cannot be read fails that pair, not the comparison
MAX_MASK_PIXELS = 400_000_000  # masks are compared whole: about 10 bytes per pixel while measuring
_GEOTIFF_TAGS = {33550, 33922, 34264}  # ModelPixelScale, ModelTiepoint, ModelTransformation: a TIFF placed on a map


@dataclass(frozen=True)
class CompareOptions:
    px_size: float | None = None  # mm per pixel of the AFTER photos (rasters: their own georeferencing where it has a scale)
    width_classes: str | None = None
    pairs: Path | None = None  # CSV of before,after paths
    vectors: str | None = None  # geojson or gpkg
    report: bool = False
    register: Path | None = None  # the site's GeoPackage
    dates: tuple[str | None, str | None] = (None, None)  # --before-date, --after-date
    transform: str = "similarity"  # the model photos are registered with
    overwrite: bool = False


@dataclass
class Side:
    """A shot's mask read whole, where its pixels lie on the map (rasters), and their own size."""

    shot: Shot
    mask: np.ndarray
    georef: tuple[tuple, str] | None = None  # (geotransform, CRS)
    own_mm: float | None = None  # mm per pixel from the raster's georeferencing; None for photos and rasters without a scale
    cracks: changes.DateCracks | None = None

    def measure(self) -> None:
        """Measure the cracks as predict measured them, so that ids are those of its cracks.csv."""
        self.cracks = changes.measure_date(self.mask, self._px(self.shot.join_gap_px, self.shot.join_gap_mm),
                                           self._px(self.shot.min_length_px, self.shot.min_length_mm))

    def _px(self, px: float | None, mm: float | None) -> float:
        if px is not None:
            return px
        if self.own_mm is None:
            raise InputError(f"{self.shot.mask}: predict measured it with lengths in mm, and it carries no pixel size to convert them")
        return mm / self.own_mm

    def mm_per_px(self, px_size: float | None, scale: float | None) -> float | None:
        """mm per pixel of this side: a raster's own, else ``px_size`` (mm per AFTER px) times ``scale`` (AFTER px per px here)."""
        if self.own_mm is not None:
            return self.own_mm
        return None if px_size is None or scale is None else px_size * scale

    def lines(self) -> dict[int, object]:
        """Each crack's centreline: map coordinates for rasters, else the image's pixel coordinates. A blob whose
        skeleton is one pixel has no link to draw: its line is empty, as in predict's vectors."""
        import shapely

        skeleton = np.zeros(self.mask.shape, bool)
        for points in self.cracks.points.values():
            skeleton[points[:, 0], points[:, 1]] = True
        found = centrelines(skeleton_links(skeleton, self.cracks.labels), self.georef[0] if self.georef else None)
        empty = shapely.from_wkt("MULTILINESTRING EMPTY")
        return {crack.id: found.get(crack.id, empty) for crack in self.cracks.cracks}


@dataclass
class RegisterRecords:
    """Cracks of both dates and the links between them, as :func:`crackseg.history.append_comparison` takes them."""

    before: list[dict] = field(default_factory=list)
    after: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    crs: set = field(default_factory=set)  # each compared pair's CRS (None: pixel coordinates); a register holds one

    def extend(self, other: RegisterRecords) -> None:
        self.before += other.before
        self.after += other.after
        self.links += other.links
        self.crs |= other.crs


@dataclass(frozen=True)
class PairOutcome:
    """What one pair adds: its row of pairs.csv (with its report pictures), its rows of changes.csv, its register records."""

    row: dict
    changes: list[dict] = field(default_factory=list)
    register: RegisterRecords | None = None


@dataclass
class Comparison:
    """What ``compare`` found, gathered for the tables, the report and the register."""

    pairs: list[dict] = field(default_factory=list)
    changes: list[dict] = field(default_factory=list)
    register: RegisterRecords = field(default_factory=RegisterRecords)

    def add(self, outcome: PairOutcome) -> None:
        self.pairs.append(outcome.row)
        self.changes += outcome.changes
        if outcome.register is not None:
            self.register.extend(outcome.register)


def compare_inspections(before: Path, after: Path, out: Path, options: CompareOptions) -> dict:
    """Compare two inspections and write the outputs to ``out``; returns the summary."""
    classes = WidthClasses.parse(options.width_classes) if options.width_classes else None
    _require_geo(options)
    _refuse_out_in_inspections(Path(out), before, after)
    visits = read_visit(before, "BEFORE"), read_visit(after, "AFTER")
    paired, alone = pair_shots(*visits, options.pairs)
    if classes is not None and options.px_size is None:
        _require_pixel_sizes(paired)
    surveys = _surveys(before, after, visits, options) if options.register else None
    outputs = CompareFolder(out, options.vectors)
    outputs.prepare(options.overwrite)
    try:
        found = Comparison()
        for index, pair in enumerate(tqdm(paired, desc="compare", unit="pair", disable=len(paired) < 2)):
            found.add(_compare_pair(index, pair, options, classes, outputs))
        for side, shot in alone:
            found.pairs.append({"pair": len(found.pairs), f"name_{side}": shot.name, f"path_{side}": str(shot.photo or shot.mask),
                                "status": ONLY_BEFORE if side == "before" else ONLY_AFTER})
        summary = _summary(before, after, found, options)
        outputs.write_tables(found, summary, options.report)
        outputs.remove_stale()
        if options.register:
            summary["register"] = _append_to_register(options.register, surveys, found, summary["registered"])
            outputs.write_summary(summary)
    finally:
        outputs.release()
    return summary


CHANGE_COLUMNS = ["path_before", "path_after", "crack_before", "crack_after", "status", "length_px_before", "length_px_after",
                  "mean_width_px_before", "mean_width_px_after", "max_width_px_before", "max_width_px_after"]


class CompareFolder:
    """The files of a comparison folder, their writing, and the folder's preparation: one compare at a time,
    nothing of an earlier compare replaced unasked, and with --overwrite none of its files left beside the new ones."""

    def __init__(self, root: Path, vectors: str | None):
        self.root = Path(root)
        self.changes_csv, self.pairs_csv = self.root / "changes.csv", self.root / "pairs.csv"
        self.summary_json, self.report_html = self.root / "summary.json", self.root / "report.html"
        self.vectors_format = vectors
        self.written: set[Path] = set()
        self._earlier: list[Path] = []  # outputs of an earlier compare found by prepare
        self._lock = FolderLock(self.root, "comparison", "--out")

    def prepare(self, overwrite: bool) -> None:
        """Before any work: take the folder's lock, refuse an earlier compare's outputs unless ``overwrite``, clear the
        temp files an interrupted compare left. The caller calls :meth:`release` at the end."""
        ensure_writable_folder(self.root, "--out")
        self._lock.acquire()
        try:
            self._earlier = self._outputs_here()
            if self._earlier and not overwrite:
                raise InputError(f"{self._earlier[0]} already exists; choose another --out or pass --overwrite")
            below = [path for sub in ("vectors", "report") for path in (self.root / sub, *(self.root / sub).rglob("*"))]
            for folder in [self.root, *(path for path in below if path.is_dir())]:
                remove_orphan_temps(folder)
        except BaseException:
            self._lock.release()
            raise

    def release(self) -> None:
        self._lock.release()

    def write_layer(self, name: str, rows: list[dict], geometries: list, crs: str | None) -> None:
        path = self.root / "vectors" / f"{name}{FORMATS[self.vectors_format][1]}"
        write_features(path, rows, geometries, crs, "changes")
        self.written.add(path)

    def write_picture(self, index: int, side: str, jpeg: bytes) -> str:
        """Write a report picture; returns its path relative to the folder, as the report links it."""
        path = self.root / "report" / f"pair{index}-{side}.jpg"
        write_atomic(path, jpeg)
        self.written.add(path)
        return path.relative_to(self.root).as_posix()

    def write_tables(self, found: Comparison, summary: dict, report: bool) -> None:
        write_csv(self.changes_csv, found.changes, CHANGE_COLUMNS)
        write_csv(self.pairs_csv, [{k: v for k, v in row.items() if not k.startswith("picture")} for row in found.pairs])
        self.written |= {self.changes_csv, self.pairs_csv}
        self.write_summary(summary)
        if report:
            self.written.add(write_change_report(self.root, summary, found.pairs, found.changes))

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.summary_json, json.dumps(summary, indent=1) + "\n")
        self.written.add(self.summary_json)

    def remove_stale(self) -> None:
        """Remove the outputs of the earlier compare (--overwrite) that this one did not write: its pictures, layers and
        report would otherwise sit beside this comparison's as if they were part of it."""
        for path in self._earlier:
            if path not in self.written:
                path.unlink(missing_ok=True)

    def _outputs_here(self) -> list[Path]:
        tables = [path for path in (self.changes_csv, self.pairs_csv, self.summary_json, self.report_html) if path.exists()]
        suffixes = {suffix for _, suffix in FORMATS.values()}
        layers = sorted(path for path in (self.root / "vectors").rglob("*")
                        if path.suffix in suffixes and not path.name.startswith(".") and path.is_file())
        pictures = sorted(path for path in (self.root / "report").glob("pair*.jpg") if path.is_file())
        return tables + layers + pictures


def _require_geo(options: CompareOptions) -> None:
    """A one-line error before any work when the libraries that --vectors or --register need are missing, naming that flag."""
    flag = "--vectors" if options.vectors else "--register" if options.register else None
    if flag:
        for module in ("shapely", "pyogrio"):
            require(module, "geo", flag)


def _refuse_out_in_inspections(out: Path, before: Path, after: Path) -> None:
    """--out inside an inspection would mix with its files: a predictions folder's summary.json and report.html are replaced."""
    target = out.resolve()
    for flag, folder in (("BEFORE", before), ("AFTER", after)):
        inspection = Path(folder).resolve()
        if target == inspection or target.is_relative_to(inspection):
            raise InputError(f"--out {out}: lies in the {flag} inspection {folder}, whose summary.json and report.html it would "
                             "replace; choose a folder outside both inspections")


def _require_pixel_sizes(paired: list[tuple[Shot, Shot]]) -> None:
    """--width-classes classes widths in mm: without --px-size every image must be a raster with its own pixel size (as predict)."""
    for shot in (shot for pair in paired for shot in pair):
        try:
            mapped = _geotiff_of(shot)
            own = _own_px_size(mapped) if mapped else None
        except PAIR_FAILURES:
            continue  # its pair fails on its own, saying why
        if own is None:
            kind = "a photo" if mapped is None else "a raster without a projected, square-pixel georeferencing"
            raise InputError(f"--width-classes needs the pixel size in mm: give --px-size ({shot.photo or shot.mask} is {kind}, "
                             "which carries none)")


def _surveys(before: Path, after: Path, visits: tuple[list[Shot], list[Shot]],
             options: CompareOptions) -> tuple[history.Survey, history.Survey]:
    """Both surveys for --register, checked now as the register will check them (dates, their order, what it holds)."""
    dates = survey_dates(visits, options.dates)
    surveys = history.Survey(dates[0], str(Path(before).resolve())), history.Survey(dates[1], str(Path(after).resolve()))
    history.check_append(options.register, *surveys)
    return surveys


def _compare_pair(index: int, pair: tuple[Shot, Shot], options: CompareOptions, classes: WidthClasses | None,
                  outputs: CompareFolder) -> PairOutcome:
    """One pair: read, registered, and when registered measured and matched. A file of the pair that cannot be read
    fails the pair alone; rasters in two CRSs stop the run."""
    before, after = pair
    row = {"pair": index, "name_before": before.name, "name_after": after.name,
           "path_before": str(before.photo or before.mask), "path_after": str(after.photo or after.mask)}
    try:
        sides = _load_side(before), _load_side(after)
    except PAIR_FAILURES as error:
        return _failed(row, error)
    alignment = _map_alignment(*sides)  # raises for two CRSs: every pair of the run would be in the wrong place
    try:
        alignment = alignment or _photo_alignment(*sides, options.transform)
        row |= {"status": alignment.status, "method": alignment.method, "inliers": alignment.inliers,
                "residual_px": None if alignment.residual_px is None else round(alignment.residual_px, 3),
                "error_px": round(alignment.error_px, 3) if alignment.registered else None, "reason": alignment.reason}
        if not alignment.registered:
            return PairOutcome(row)
        return _registered_pair(row, sides, alignment, options, classes, outputs)
    except PAIR_FAILURES as error:
        return _failed(row, error)


def _failed(row: dict, error: Exception) -> PairOutcome:
    reason = str(error) or type(error).__name__
    tqdm.write(f"crackseg: error: pair {row['pair']} ({row['name_before']} -> {row['name_after']}): {reason}", file=sys.stderr)
    return PairOutcome(row | {"status": FAILED, "reason": reason})


def _registered_pair(row: dict, sides: tuple[Side, Side], alignment: Alignment, options: CompareOptions,
                     classes: WidthClasses | None, outputs: CompareFolder) -> PairOutcome:
    """A registered pair's cracks measured and matched: its rows, report pictures, change layer and register records."""
    before, after = sides
    before.measure()
    after.measure()
    tolerance = changes.MATCH_TOLERANCE_PX + alignment.error_px
    matched = changes.match(before.cracks, after.cracks, alignment, tolerance)
    rows = [_change_row(row, change, sides, options.px_size, classes) for change in matched]
    row = row | {"tolerance_px": round(tolerance, 3)} | changes.count_statuses(row["status"] for row in rows) | {
        "length_px_before": round(sum(c.length_px for c in before.cracks.cracks), 2),
        "length_px_after": round(sum(c.length_px for c in after.cracks.cracks), 2)}
    if options.report:
        row |= _pictures(outputs, row["pair"], sides, matched)
    lines = (before.lines(), after.lines()) if options.vectors or options.register else None
    if options.vectors:
        _write_change_layer(outputs, sides, matched, rows, lines, alignment)
    register = _register_records(sides, matched, lines, options.px_size, classes) if options.register else None
    return PairOutcome(row, [change | {"pair": row["pair"]} for change in rows], register)


def _load_side(shot: Shot) -> Side:
    """The shot's mask as crack pixels (by the project's mask rules), with the georeferencing of the mask, or of its
    image for a PNG mask of a raster."""
    mapped = _geotiff_of(shot)
    mask = _read_geotiff_mask(shot.mask) if mapped == shot.mask else _read_mask(shot.mask)
    if mapped is None:
        return Side(shot, mask)
    with RasterSource(mapped, max_pixels=MAX_MASK_PIXELS) as source:
        if (source.height, source.width) != mask.shape:
            raise InputError(f"{shot.mask}: {mask.shape[1]}x{mask.shape[0]} px, but {mapped} is {source.width}x{source.height}")
        return Side(shot, mask, (tuple(source.transform)[:6], source.crs.to_string()), source.px_size_mm()[0])


def _read_mask(path: Path) -> np.ndarray:
    try:
        return read_saved_mask(path)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: not a readable mask ({describe_error(error)})") from None


def _read_geotiff_mask(path: Path) -> np.ndarray:
    """(H, W) bool crack pixels of a georeferenced mask: above CRACK_THRESHOLD, or 1 in a 0/1 mask (as images reads masks)."""
    with rasterio().open(path) as raster:
        if raster.width * raster.height > MAX_MASK_PIXELS:
            raise InputError(f"{path}: {raster.width * raster.height / 1e6:,.0f} megapixels; compare reads masks whole, "
                             f"up to {MAX_MASK_PIXELS / 1e6:,.0f}")
        levels = raster.read(1)
    return levels > 0 if is_zero_one(levels) else levels > CRACK_THRESHOLD


def _geotiff_of(shot: Shot) -> Path | None:
    """The shot's mask, else its image, where it is a georeferenced raster; None for photos."""
    return next((path for path in (shot.mask, shot.photo) if _georeferenced(path)), None)


def _georeferenced(path: Path | None) -> bool:
    """Whether ``path`` is a TIFF placed on a map (a CRS and a geotransform). Pillow reads the tags first, so that a
    plain TIFF needs no rasterio."""
    if path is None or path.suffix.lower() not in (".tif", ".tiff") or not path.exists():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # only the header is read here
            with Image.open(path) as image:
                tags = set(getattr(image, "tag_v2", {}))
        if not _GEOTIFF_TAGS & tags:
            return False
    except DECODE_ERRORS:
        pass  # a TIFF that Pillow cannot open (too large, BigTIFF) may still be a raster: rasterio decides
    with rasterio().open(path) as raster:
        return on_map(raster)


def _own_px_size(raster: Path) -> float | None:
    with RasterSource(raster, max_pixels=MAX_MASK_PIXELS) as source:
        return source.px_size_mm()[0]


def _map_alignment(before: Side, after: Side) -> Alignment | None:
    """Two georeferenced rasters aligned by their map coordinates; None unless both are."""
    return align_by_map(before.georef, after.georef) if before.georef and after.georef else None


def _photo_alignment(before: Side, after: Side, transform: str) -> Alignment:
    """Two photos registered by their features; unregistered when only one side is on a map or a mask does not fit its photo."""
    if before.georef or after.georef:
        return Alignment(status=UNREGISTERED, method="none", reason="one side is georeferenced and the other is not")
    for side in (before, after):
        photo = side.shot.photo
        if photo is None or not photo.exists():
            raise InputError(f"photo not found: {photo}" if photo else f"{side.shot.mask}: no photo listed for this mask")
        try:
            with Image.open(photo) as image:
                size = displayed_size(image)
        except DECODE_ERRORS as error:
            raise InputError(f"{photo}: {describe_error(error)}") from None
        if size != (side.mask.shape[1], side.mask.shape[0]):
            return Alignment(status=UNREGISTERED, method="none",
                             reason=f"{side.shot.mask} is {side.mask.shape[1]}x{side.mask.shape[0]} px, its photo {size[0]}x{size[1]}")
    return register_photo_files(before.shot.photo, after.shot.photo, transform)


def _change_row(pair: dict, change: changes.Change, sides: tuple[Side, Side], px_size: float | None,
                classes: WidthClasses | None) -> dict:
    """A row of changes.csv: the crack's ids, status and measurements of both dates, its box in the AFTER image."""
    before, after = sides
    row = {"path_before": pair["path_before"], "path_after": pair["path_after"],
           "crack_before": change.before.id if change.before else None, "crack_after": change.after.id if change.after else None,
           "status": change.status}
    # mm per pixel of each date: a raster's own, else --px-size for AFTER, and BEFORE's pixels through the registration's scale
    before_mm, after_mm = before.mm_per_px(px_size, change.scale), after.mm_per_px(px_size, 1.0)
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
    if after.georef:
        a, b, c, d, e, f = after.georef[0]
        xs, ys = zip(*((a * x + b * y + c, d * x + e * y + f) for y in (top, bottom) for x in (left, right)))
        row |= {"x_min": min(xs), "y_min": min(ys), "x_max": max(xs), "y_max": max(ys)}
    return row


def _write_change_layer(outputs: CompareFolder, sides: tuple[Side, Side], matched: list[changes.Change], rows: list[dict],
                        lines: tuple[dict, dict], alignment: Alignment) -> None:
    """The pair's change layer: AFTER centrelines with their status; gone cracks with their BEFORE centreline, in the AFTER frame."""
    import shapely

    before, after = sides

    def into_after(x: np.ndarray) -> np.ndarray:  # BEFORE pixel-centre (x, y) -> AFTER
        rows_cols = alignment.map_points(np.column_stack([x[:, 1] - 0.5, x[:, 0] - 0.5]))
        return np.column_stack([rows_cols[:, 1] + 0.5, rows_cols[:, 0] + 0.5])

    geometries = []
    for change in matched:
        if change.after is not None:
            geometries.append(lines[1][change.after.id])
        elif before.georef:
            geometries.append(lines[0][change.before.id])  # map coordinates already
        else:
            geometries.append(shapely.transform(lines[0][change.before.id], into_after))
    outputs.write_layer(after.shot.name, rows, geometries, after.georef[1] if after.georef else None)


def _register_records(sides: tuple[Side, Side], matched: list[changes.Change], lines: tuple[dict, dict], px_size: float | None,
                      classes: WidthClasses | None) -> RegisterRecords:
    """The pair's cracks of both dates, with mm and width class as changes.csv gives them, and the links between them."""
    before, after = sides
    scales = {change.before.id: change.scale for change in matched if change.before is not None}  # AFTER px per BEFORE px
    return RegisterRecords(
        before=[_crack_record(before, crack, lines[0][crack.id], before.mm_per_px(px_size, scales.get(crack.id)), classes)
                for crack in before.cracks.cracks],
        after=[_crack_record(after, crack, lines[1][crack.id], after.mm_per_px(px_size, 1.0), classes) for crack in after.cracks.cracks],
        links=[{"before_image": before.shot.name, "before_crack": change.before.id, "after_image": after.shot.name,
                "after_crack": change.after.id, "status": change.status}
               for change in matched if change.before is not None and change.after is not None],
        crs={after.georef[1] if after.georef else None})


def _crack_record(side: Side, crack, line, mm_per_px: float | None, classes: WidthClasses | None) -> dict:
    record = {"image": side.shot.name, "crack": crack.id, "length_px": crack.length_px, "mean_width_px": crack.mean_width_px,
              "max_width_px": crack.max_width_px, "geometry": line}
    if mm_per_px is not None:
        record |= {f"{key}_mm": getattr(crack, f"{key}_px") * mm_per_px for key in ("length", "mean_width", "max_width")}
        if classes is not None:
            record["max_width_class"] = classes.classify(record["max_width_mm"])
    return record


def _pictures(outputs: CompareFolder, index: int, sides: tuple[Side, Side], matched: list[changes.Change]) -> dict:
    """Both photos with their cracks coloured by status, for the report (none for rasters: too large to picture whole)."""
    if any(side.georef for side in sides):
        return {"picture_before": None, "picture_after": None}
    coloured = [change for change in matched if change.status in STATUS_COLOURS]  # a status without a colour: as photographed
    statuses = ({c.before.id: c.status for c in coloured if c.before}, {c.after.id: c.status for c in coloured if c.after})
    pictures = {}
    for side, when, colours in zip(sides, ("before", "after"), statuses):
        try:
            photo = image_pixels(side.shot.photo)
        except DECODE_ERRORS as error:
            raise InputError(f"{side.shot.photo}: {describe_error(error)}") from None
        pictures[f"picture_{when}"] = outputs.write_picture(index, when, change_picture(photo, side.cracks.labels, colours))
    return pictures


def _summary(before: Path, after: Path, found: Comparison, options: CompareOptions) -> dict:
    def names(status: str, side: str = "after") -> list[str]:
        return [row[f"name_{side}"] for row in found.pairs if row["status"] == status]

    return {
        "before": str(before), "after": str(after),
        "pairs": sum(row["status"] not in (ONLY_BEFORE, ONLY_AFTER) for row in found.pairs),
        "registered": len(names("registered")),
        "unregistered": names(UNREGISTERED),
        "failed": names(FAILED),  # pairs.csv gives each one's reason
        "only_before": names(ONLY_BEFORE, "before"),
        "only_after": names(ONLY_AFTER),
        "cracks": changes.count_statuses(row["status"] for row in found.changes),
        "px_size_mm": options.px_size,
        "transform": options.transform,
    }


def _append_to_register(register: Path, surveys: tuple[history.Survey, history.Survey], found: Comparison, registered: int) -> dict:
    """Append the comparison to the site's register; nothing when no pair was registered (surveys without cracks
    would say the site had none)."""
    if not registered:
        print(f"nothing appended to {register}: no pair was registered")
        return {"appended": False, "reason": "no pair was registered"}
    records = found.register
    if len(records.crs) > 1:
        raise InputError(f"--register {register}: the pairs lie in several CRSs or mix photos and rasters "
                         f"({', '.join(sorted(map(str, records.crs)))})")
    added = history.append_comparison(register, *surveys, (records.before, records.after), records.links, next(iter(records.crs)))
    return {"appended": True, **added}
