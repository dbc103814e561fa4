"""One pair of shots compared: both masks read, the pair registered and, when registered, its cracks measured and matched.

Each mask is read whole by the project's mask rule (:func:`crackseg.data.images.crack_pixels`) and placed on
the map by its own georeferencing, or by its image's for a PNG mask of a raster; whether a file is a raster
on the map, and its facts, are crackseg.data.rasters' to say (:func:`~crackseg.data.rasters.open_on_map`), and
one open of a raster serves the test, the facts and the pixels. Rasters align by map coordinates, photos by
their features (:mod:`crackseg.monitoring.registration`); cracks are measured as predict measures them and
matched by their centrelines (:mod:`crackseg.monitoring.changes`), sizes in mm converted as predict converts
them (:func:`crackseg.cracks.measure.in_mm`).

What a pair adds to the comparison is its :class:`PairOutcome`: its row of pairs.csv, its rows of changes.csv,
its register records; its report pictures and change layer are written into the comparison folder as it goes.
A file of the pair that cannot be read fails the pair alone; an output that cannot be written (a full disk) stops
the comparison.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from tqdm import tqdm

from crackseg.core.errors import InputError, RunError
from crackseg.cracks.vectors import centrelines, skeleton_links
from crackseg.cracks.widths import WidthClasses, in_mm
from crackseg.data.images import DECODE_ERRORS, crack_mask, crack_pixels, describe_error, displayed_size, image_pixels
from crackseg.data.rasters import MapFacts, map_facts, open_on_map
from crackseg.monitoring import changes, date_cracks
from crackseg.monitoring.options import CompareOptions
from crackseg.monitoring.registration import UNREGISTERED, Alignment, align_by_map, register_photo_files
from crackseg.monitoring.report import STATUS_COLOURS, change_picture
from crackseg.monitoring.visits import Shot

if TYPE_CHECKING:
    from crackseg.monitoring.comparison_folder import ComparisonFolder

FAILED = "failed"
PAIR_FAILURES = (InputError, OSError)  # a file of one pair that cannot be read fails that pair, not the comparison
MAX_MASK_PIXELS = 400_000_000  # masks are compared whole: about 10 bytes per pixel while measuring
_SIZES = ("length", "mean_width", "max_width")  # the measurements changes.csv gives in px, and in mm with a pixel size


@dataclass
class Side:
    """A shot's mask read whole, where its pixels lie on the map (rasters), and their own size."""

    shot: Shot
    mask: np.ndarray
    georef: tuple[tuple, str] | None = None  # (geotransform, CRS)
    own_mm: float | None = None  # mm per pixel from the raster's georeferencing; None for photos and rasters without a scale
    cracks: date_cracks.DateCracks | None = None

    def measure(self) -> None:
        """Measure the cracks as predict measured them, so that ids are those of its cracks.csv."""
        self.cracks = date_cracks.measure_date(self.mask, self._px(self.shot.join_gap_px, self.shot.join_gap_mm),
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
    """Cracks of both dates and the links between them, as :func:`crackseg.monitoring.history.append_comparison` takes them."""

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


def compare_pair(index: int, pair: tuple[Shot, Shot], options: CompareOptions, classes: WidthClasses | None,
                 outputs: ComparisonFolder, known: dict[Path, bool]) -> PairOutcome:
    """One pair: read, registered, and when registered measured and matched. A file of the pair that cannot be read
    fails the pair alone; rasters in two CRSs, or an output that cannot be written, stop the run."""
    before, after = pair
    row = {"pair": index, "name_before": before.name, "name_after": after.name,
           "path_before": str(before.photo or before.mask), "path_after": str(after.photo or after.mask)}
    try:
        sides = _load_side(before, known), _load_side(after, known)
    except PAIR_FAILURES as error:
        return failed_pair(row, error)
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
        return failed_pair(row, error)


def failed_pair(row: dict, error: Exception | str) -> PairOutcome:
    """The pair of ``row`` failed, said on stderr now and in its row."""
    reason = str(error) or type(error).__name__
    tqdm.write(f"crackseg: error: pair {row['pair']} ({row['name_before']} -> {row['name_after']}): {reason}", file=sys.stderr)
    return PairOutcome(row | {"status": FAILED, "reason": reason})


def _registered_pair(row: dict, sides: tuple[Side, Side], alignment: Alignment, options: CompareOptions,
                     classes: WidthClasses | None, outputs: ComparisonFolder) -> PairOutcome:
    """A registered pair's cracks measured and matched: its rows, report pictures, change layer and register records."""
    before, after = sides
    before.measure()
    after.measure()
    tolerance = changes.MATCH_TOLERANCE_PX + alignment.error_px
    matched = changes.match(before.cracks, after.cracks, alignment, tolerance)
    rows = [_change_row(row, change, sides, options.scale.px_size, classes) for change in matched]
    graded = {"class_changed": _class_changes(matched, rows, classes)} if rows and "class_changed" in rows[0] else {}
    row = row | {"tolerance_px": round(tolerance, 3)} | changes.count_statuses(row["status"] for row in rows) | graded | {
        "length_px_before": round(sum(c.length_px for c in before.cracks.cracks), 2),
        "length_px_after": round(sum(c.length_px for c in after.cracks.cracks), 2)} | _pair_growth(matched, after, options.scale.px_size)
    lines = (before.lines(), after.lines()) if options.vectors or options.register else None
    try:
        if options.report:
            row |= _pictures(outputs, row["pair"], sides, matched)
        if options.vectors:
            _write_change_layer(outputs, sides, matched, rows, lines, alignment)
    except OSError as error:  # writing --out (a full disk): not this pair's doing, and every later pair would fail alike
        where = f"{error.filename}: " if error.filename else ""
        raise RunError(f"{where}{error.strerror or error}") from None
    register = _register_records(sides, matched, lines, options.scale.px_size, classes) if options.register else None
    return PairOutcome(row, [change | {"pair": row["pair"]} for change in rows], register)


def _pair_growth(matched: list[changes.Change], after: Side, px_size: float | None) -> dict:
    """How much longer the pair's cracks got, in the AFTER image's pixels (and mm with a pixel size): the two dates'
    total lengths are each in their own photo's pixels, and count the gaps each date's join bridged."""
    growth = {"length_growth_px": round(changes.length_growth(matched), 2)}
    mm = after.mm_per_px(px_size, 1.0)
    return growth if mm is None else growth | {"length_growth_mm": round(growth["length_growth_px"] * mm, 4)}


def _load_side(shot: Shot, known: dict[Path, bool]) -> Side:
    """The shot's mask as crack pixels (by the project's mask rule), with the georeferencing of the mask, or of its
    image for a PNG mask of a raster. ``known``: whether files lie on the map, as :func:`map_facts_of` found them."""
    mapped, dataset = _open_on_map(shot, known)
    try:
        mask = _read_map_mask(shot.mask, dataset) if mapped == shot.mask else _read_mask(shot.mask)
        if mapped is None:
            return Side(shot, mask)
        facts = map_facts(mapped, dataset, MAX_MASK_PIXELS)
    finally:
        if dataset is not None and not dataset.closed:
            dataset.close()
    if (facts.height, facts.width) != mask.shape:
        raise InputError(f"{shot.mask}: {mask.shape[1]}x{mask.shape[0]} px, but {mapped} is {facts.width}x{facts.height}")
    return Side(shot, mask, (facts.transform, facts.crs), facts.px_size_mm)


def map_facts_of(shot: Shot, known: dict[Path, bool]) -> MapFacts | None:
    """The facts of the file that places ``shot`` on the map (its mask, else its image); None for a photo. Records in
    ``known`` whether each file it opened lies on the map, so that reading the pair later opens none off the map again."""
    mapped, dataset = _open_on_map(shot, known)
    return None if mapped is None else map_facts(mapped, dataset, MAX_MASK_PIXELS)


def _open_on_map(shot: Shot, known: dict[Path, bool]) -> tuple[Path | None, object]:
    """The shot's mask, else its image, where it lies on the map, with its open rasterio dataset; (None, None) for
    a photo. A file ``known`` to lie off the map is not opened again."""
    for path in (shot.mask, shot.photo):
        if path is None or known.get(path) is False:
            continue
        dataset = open_on_map(path)
        known[path] = dataset is not None
        if dataset is not None:
            return path, dataset
    return None, None


def _read_mask(path: Path) -> np.ndarray:
    try:
        return crack_mask(path)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: not a readable mask ({describe_error(error)})") from None


def _read_map_mask(path: Path, raster) -> np.ndarray:
    """(H, W) bool crack pixels of a georeferenced mask, open as ``raster``, by the mask rule of every mask."""
    if raster.width * raster.height > MAX_MASK_PIXELS:
        raise InputError(f"{path}: {raster.width * raster.height / 1e6:,.0f} megapixels; compare reads masks whole, "
                         f"up to {MAX_MASK_PIXELS / 1e6:,.0f}")
    return crack_pixels(raster.read(1))


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
        px = {f"{key}_px": getattr(crack, f"{key}_px") if crack else None for key in _SIZES}
        sizes = in_mm(px, mm) if mm is not None else {}
        for key in _SIZES:
            value = px[f"{key}_px"]
            row[f"{key}_px_{when}"] = None if value is None else round(value, 3)
            if mm is not None:
                row[f"{key}_mm_{when}"] = sizes[f"{key}_mm"]
    # growth as the status was judged: in the AFTER image's pixels (BEFORE's through the registration's scale), a
    # merged or split group's as a whole; the two dates' px columns are each in their own photo's pixels
    growth = {"length_px": change.length_growth_px, "mean_width_px": change.mean_width_growth_px, "max_width_px": change.max_width_growth_px}
    for key, value in growth.items():
        row[key.replace("_px", "_growth_px")] = None if value is None else round(value, 3)
    if after_mm is not None:
        row |= {key.replace("_mm", "_growth_mm"): value for key, value in in_mm(growth, after_mm).items()}
    if classes is not None and before_mm is not None and after_mm is not None:  # the class of the width the standard grades
        before_class = classes.grade(row, "_before") if change.before else None
        after_class = classes.grade(row, "_after") if change.after else None
        row |= {f"{classes.graded_column}_before": before_class, f"{classes.graded_column}_after": after_class,
                "class_changed": bool(before_class and after_class and before_class != after_class)}
    top, left, bottom, right = change.box_after
    row |= {"top": top, "left": left, "bottom": bottom, "right": right}
    if after.georef:
        a, b, c, d, e, f = after.georef[0]
        xs, ys = zip(*((a * x + b * y + c, d * x + e * y + f) for y in (top, bottom) for x in (left, right)))
        row |= {"x_min": min(xs), "y_min": min(ys), "x_max": max(xs), "y_max": max(ys)}
    return row


def _class_changes(matched: list[changes.Change], rows: list[dict], classes: WidthClasses) -> int:
    """Set each row's ``class_changed`` as its status is judged, on its group of linked cracks as a whole: the group's
    graded width on each date (its widest crack's, or for a standard grading mean widths the length-weighted mean of
    its cracks') in that date's class; a crack the masks break into pieces does not change class by its narrowest
    piece. Returns how many groups changed class."""
    changed = 0
    for members in changes.groups_of(matched):
        group = [rows[index] for index in members]
        widths = [_group_width(group, when, classes.graded) for when in ("before", "after")]
        flag = None not in widths and classes.classify(widths[0]) != classes.classify(widths[1])
        for member in group:
            member["class_changed"] = flag
        changed += flag
    return changed


def _group_width(group: list[dict], when: str, graded: str) -> float | None:
    """The graded width in mm of a group's cracks of one date (each once, however many rows name it); None for none."""
    cracks = {row[f"crack_{when}"]: row for row in group if row[f"crack_{when}"] is not None}
    widths = [row[f"{graded}_width_mm_{when}"] for row in cracks.values()]
    if not widths:
        return None
    if graded == "max":
        return max(widths)
    lengths = [row[f"length_mm_{when}"] for row in cracks.values()]
    return float(np.average(widths, weights=np.add(lengths, 1e-12)))


def _write_change_layer(outputs: ComparisonFolder, sides: tuple[Side, Side], matched: list[changes.Change], rows: list[dict],
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
    """The pair's cracks of both dates, with mm and width class as changes.csv gives them, and the links between them:
    one per changes.csv row that compared a crack with the other date, its side None where that date shows it shorter
    than the minimum length (no crack of that survey), and one per crack not seen, its other side None (it lay outside
    the view both dates share: neither gone nor new)."""
    before, after = sides
    scales = {change.before.id: change.scale for change in matched if change.before is not None}  # AFTER px per BEFORE px
    return RegisterRecords(
        before=[_crack_record(before, crack, lines[0][crack.id], before.mm_per_px(px_size, scales.get(crack.id)), classes)
                for crack in before.cracks.cracks],
        after=[_crack_record(after, crack, lines[1][crack.id], after.mm_per_px(px_size, 1.0), classes) for crack in after.cracks.cracks],
        links=[{"before_image": before.shot.name, "before_crack": change.before.id if change.before else None,
                "after_image": after.shot.name, "after_crack": change.after.id if change.after else None, "status": change.status}
               for change in matched if change.status not in (changes.NEW, changes.GONE)],
        crs={after.georef[1] if after.georef else None})


def _crack_record(side: Side, crack, line, mm_per_px: float | None, classes: WidthClasses | None) -> dict:
    record = {"image": side.shot.name, "crack": crack.id, "length_px": crack.length_px, "mean_width_px": crack.mean_width_px,
              "max_width_px": crack.max_width_px, "geometry": line}
    if mm_per_px is not None:
        record |= in_mm(record, mm_per_px, digits=None)
        if classes is not None:
            record[classes.graded_column] = classes.grade(record)
    return record


def _pictures(outputs: ComparisonFolder, index: int, sides: tuple[Side, Side], matched: list[changes.Change]) -> dict:
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
