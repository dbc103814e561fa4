"""``crackseg compare BEFORE AFTER``: what changed between two inspections of one structure.

Each side is a ``predict`` output folder or a dataset folder (``images/`` + ``masks/``);
images pair by their relative name, or by a CSV of before,after paths. Per pair
(:mod:`crackseg.monitoring.pair`): the two are registered (map coordinates for georeferenced
rasters, image features for photos), the cracks of both dates are measured as ``predict``
measures them, and matched by their centrelines (:mod:`crackseg.monitoring.changes`); this module
is the run around the pairs. A pair that cannot be registered reliably is listed as
``unregistered`` and not compared; a pair whose files cannot be read is listed as ``failed``
with the reason, and the other pairs go on. Rasters in two CRSs stop the run: every pair would
be compared in the wrong place.

Written to ``--out`` (:mod:`crackseg.monitoring.comparison_folder`): ``changes.csv`` (a row per
crack), ``pairs.csv`` (a row per pair, and per image present on one side only), ``summary.json``;
with ``--vectors`` a change layer per pair, with ``--report`` report.html; with ``--register``
the site's crack register (:mod:`crackseg.monitoring.history`) is extended. What can be refused
is refused before any work. BEFORE, AFTER and ``--out`` may be s3:// prefixes (:mod:`crackseg.core.staging`): the
run works on local copies, and what it writes names the URLs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from crackseg.core.errors import InputError, require
from crackseg.core.files import read_csv, write_csv
from crackseg.core.staging import StagedFolder, StagedSources, inside
from crackseg.core.urls import shown_location
from crackseg.cracks.widths import WidthClasses
from crackseg.data.rasters import MapFacts
from crackseg.monitoring import changes, history
from crackseg.monitoring.comparison_folder import ComparisonFolder, writes_at
from crackseg.monitoring.options import CompareOptions
from crackseg.monitoring.pair import FAILED, PAIR_FAILURES, PairOutcome, RegisterRecords, compare_pair, failed_pair, map_facts_of
from crackseg.monitoring.register_file import locked
from crackseg.monitoring.registration import UNREGISTERED, crs_problem
from crackseg.monitoring.surveys import Survey
from crackseg.monitoring.visits import Shot, Visit, pair_shots, read_visit, survey_dates

ONLY_BEFORE, ONLY_AFTER = "only before", "only after"
_INSPECTION = "an inspection (a predict output folder or a dataset)"


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


def compare_inspections(options: CompareOptions) -> dict:
    """Compare two inspections and write the outputs to ``options.out``; returns the summary. BEFORE, AFTER and --out
    may each be an s3:// prefix: staged locally (:mod:`crackseg.core.staging`), the outputs naming the URLs."""
    _require_geo(options)
    for flag, side in (("BEFORE", options.before), ("AFTER", options.after)):
        if inside(options.out, side):
            raise InputError(f"--out {shown_location(options.out)}: lies in the {flag} inspection {shown_location(side)}, whose "
                             "summary.json and report.html it would replace; choose one outside both inspections")
    out = StagedFolder(options.out, "compare", "comparisons", without_lock="write --out to a local folder and copy it up")
    with out, StagedSources("compare") as sources:
        def shown(text: str) -> str:
            return sources.shown(out.shown_text(text))

        try:
            out.prepare(writes_at)  # the lock, and in a store its listing, before any download
            if out.existed(out.root / "predictions.csv"):
                raise InputError(f"--out {shown_location(options.out)}: a predictions folder (predictions.csv), whose summary.json, "
                                 "report and layers compare's would replace; choose a folder of its own")
            before, after = (sources.folder(side, flag, _INSPECTION, lambda copy: _stage_photos(copy, sources))
                             for flag, side in (("BEFORE", options.before), ("AFTER", options.after)))
            summary = _compare(before, after, ComparisonFolder(out, options.vectors, options.register, shown), options, shown)
            out.finish()
        except InputError as error:  # a message naming a staged copy names its URL
            if shown(str(error)) == str(error):
                raise
            raise InputError(shown(str(error))) from None
    return summary


def _stage_photos(inspection: Path, sources: StagedSources) -> None:
    """The photos a staged predictions folder names by URL (predict read them from the store), downloaded, and the staged
    predictions.csv pointed at them. A GeoTIFF is not: compare places a raster by its mask and never reads its pixels
    (it would be downloaded whole), so it keeps its URL, which names it in the outputs."""
    table = inspection / "predictions.csv"
    if not table.is_file():
        return
    rows = read_csv(table)
    if not rows:  # written again, a table without rows would lose its columns
        return
    for row in rows:
        if row.get("path"):
            row["path"] = str(sources.file(row["path"], lambda name: Path(name).suffix.lower() not in (".tif", ".tiff")))
    write_csv(table, rows)


def _compare(before: Path, after: Path, outputs: ComparisonFolder, options: CompareOptions, shown: Callable[[str], str]) -> dict:
    """The run on local folders; ``shown`` names a staged folder by its URL in what is written."""
    classes = options.scale.classes()
    visits = read_visit(before, "BEFORE"), read_visit(after, "AFTER")
    paired, alone = pair_shots(visits[0].shots, visits[1].shots, options.pairs)
    known, read = _read_map_facts(paired)
    if classes is not None and options.scale.px_size is None:
        _require_pixel_sizes(paired, read)
    crs = _map_crs(paired, read, shown)
    surveys = _surveys(before, after, (visits[0].shots, visits[1].shots), options, crs, shown) if options.register else None
    outputs.prepare(options.overwrite, [shot.name for _, shot in paired], len(paired), options.report)
    with locked(options.register) if options.register else nullcontext():  # no other compare appends meanwhile
        warnings = [shown(warning) for warning in (_same_inspection(options), *_left_out_alone(visits, alone)) if warning]
        for warning in warnings:  # said once nothing refuses the run
            print(f"crackseg: warning: {warning}", file=sys.stderr)
        found = Comparison()
        for index, pair in enumerate(tqdm(paired, desc="compare", unit="pair", disable=len(paired) < 2)):
            found.add(compare_pair(index, pair, options, classes, outputs, known))
        for side, shot in alone:
            found.add(_alone(len(found.pairs), side, shot, visits))
        for row in found.pairs + found.changes:
            row.update({key: shown(value) for key, value in row.items() if isinstance(value, str)})
        summary = _summary(shown(str(before)), shown(str(after)), found, options, classes) | ({"warnings": warnings} if warnings else {})
        if options.register and summary["registered"]:  # what the register would refuse of the cracks, before --out is written
            registered = {row["name_before"] for row in found.pairs if row["status"] == "registered" and row.get("name_before")}
            history.check_cracks(options.register, *surveys, found.register.before, registered)
        outputs.write_tables(found.pairs, found.changes, summary, options.report)
        outputs.remove_stale()
        if options.register:
            summary["register"] = _append_to_register(options.register, surveys, found, summary["registered"], classes)
            outputs.write_summary(summary)
        return summary


def _alone(index: int, side: str, shot: Shot, visits: tuple[Visit, Visit]) -> PairOutcome:
    """The row of an image only one visit has; a failed pair where the other visit has the image but it cannot be
    compared (the dataset reader could not pair it, predict failed on it), saying why."""
    other, flag = ("after", "AFTER") if side == "before" else ("before", "BEFORE")
    row = {"pair": index, f"name_{side}": shot.name, f"path_{side}": str(shot.photo or shot.mask)}
    left = visits[1 if side == "before" else 0].left_out_as(shot.name)
    if left is None:
        return PairOutcome(row | {"status": ONLY_BEFORE if side == "before" else ONLY_AFTER})
    row = {"pair": index, "name_before": shot.name, "name_after": shot.name} | row | {f"path_{other}": str(left.path)}
    return failed_pair({key: row[key] for key in ("pair", "name_before", "name_after", "path_before", "path_after")},
                       f"{flag} {left.path}: {left.reason}")


def _left_out_alone(visits: tuple[Visit, Visit], alone: list[tuple[str, Shot]]) -> list[str]:
    """A warning per image (or subfolder of images) of either visit that cannot be compared and pairs with nothing:
    its pair would have failed had the other visit the image."""
    names = {shot.name for _, shot in alone}
    return [f"{flag} {left.path}: {left.reason}; not compared" for flag, visit in zip(("BEFORE", "AFTER"), visits)
            for left in visit.left_out if not left.names or not set(left.names) <= names]


def _require_geo(options: CompareOptions) -> None:
    """A one-line error before any work when the libraries that --vectors or --register need are missing, naming that flag."""
    flag = "--vectors" if options.vectors else "--register" if options.register else None
    if flag:
        for module in ("shapely", "pyogrio"):
            require(module, "geo", flag)


def _read_map_facts(paired: list[tuple[Shot, Shot]]) -> tuple[dict[Path, bool], dict[int, MapFacts | None]]:
    """Which files lie on the map, so that reading the pairs tells it without opening them again, and the map facts
    of each shot (by id; None for a photo) that can be read: one that cannot fails its pair on its own, saying why."""
    known: dict[Path, bool] = {}
    facts: dict[int, MapFacts | None] = {}
    for shot in (shot for pair in paired for shot in pair):
        try:
            facts[id(shot)] = map_facts_of(shot, known)
        except PAIR_FAILURES:
            continue
    return known, facts


def _require_pixel_sizes(paired: list[tuple[Shot, Shot]], read: dict[int, MapFacts | None]) -> None:
    """--width-classes classes widths in mm: without --px-size every image must be a raster with its own pixel size (as predict)."""
    for shot in (shot for pair in paired for shot in pair if id(shot) in read):
        facts = read[id(shot)]
        if facts is None or facts.px_size_mm is None:
            kind = "a photo" if facts is None else "a raster without a projected, square-pixel georeferencing"
            raise InputError(f"--width-classes needs the pixel size in mm: give --px-size ({shot.photo or shot.mask} is {kind}, "
                             "which carries none)")


def _surveys(before: Path, after: Path, visits: tuple[list[Shot], list[Shot]], options: CompareOptions,
             crs: set, shown: Callable[[str], str]) -> tuple[Survey, Survey]:
    """Both surveys for --register, checked now as the register will check them (dates, their order, what it holds, its
    CRS against ``crs``, whether it can be written now), before anything is written."""
    dates = survey_dates(visits, options.dates)
    classes = options.scale.classes()
    scale = {"px_size_mm": options.scale.px_size, "width_classes": classes.flag_value if classes is not None else ""}
    surveys = tuple(Survey(date, shown(str(Path(side).resolve())), **scale) for date, side in zip(dates, (before, after)))
    history.check_append(options.register, *surveys, crs)
    return surveys


def _map_crs(paired: list[tuple[Shot, Shot]], read: dict[int, MapFacts | None], shown: Callable[[str], str]) -> set:
    """The CRSs the register's cracks would lie in, from the headers of each pair's AFTER file (None for a photo: pixel
    coordinates). Two rasters of a pair in two CRSs are refused here, before any work: every pair of the run would be
    in the wrong place. A file that cannot be read fails its pair later, saying why. ``shown`` names the files."""
    found = set()
    for pair in paired:
        if not all(id(shot) in read for shot in pair):
            continue
        before, after = (read[id(shot)] for shot in pair)
        names = [shown(str(shot.mask or shot.photo)) for shot in pair]
        problem = crs_problem(before.crs, after.crs, *names) if before is not None and after is not None else None
        if problem:
            raise InputError(problem)
        found.add(None if after is None else after.crs)
    return found


def _summary(before: str, after: str, found: Comparison, options: CompareOptions, classes: WidthClasses | None) -> dict:
    def names(status: str, side: str = "after") -> list[str]:
        return [row[f"name_{side}"] for row in found.pairs if row["status"] == status]

    summary = {
        "before": str(before), "after": str(after),
        "pairs": sum(row["status"] not in (ONLY_BEFORE, ONLY_AFTER) for row in found.pairs),
        "registered": len(names("registered")),
        "unregistered": names(UNREGISTERED),
        "failed": names(FAILED),  # pairs.csv gives each one's reason
        "only_before": names(ONLY_BEFORE, "before"),
        "only_after": names(ONLY_AFTER),
        "cracks": changes.count_statuses(row["status"] for row in found.changes),
        "px_size_mm": options.scale.px_size,
        "transform": options.transform,
    }
    if classes is not None:  # changes.csv's class columns are those of the width the standard grades
        summary["width_classes"] = classes.as_dict() | {"class_changed": sum(row.get("class_changed", 0) for row in found.pairs)}
    return summary


def _same_inspection(options: CompareOptions) -> str | None:
    """The warning for BEFORE and AFTER naming one folder (a slip when typing two visits): every crack matches itself.
    None with --register, which refuses such a comparison."""
    if options.register or not (inside(options.before, options.after) and inside(options.after, options.before)):
        return None
    return (f"BEFORE and AFTER are the same inspection ({shown_location(options.before)}): every crack is compared with itself, "
            "so none can be new, longer, wider or gone; give the earlier and the later visit")


def _append_to_register(register: Path, surveys: tuple[Survey, Survey], found: Comparison, registered: int,
                        classes: WidthClasses | None) -> dict:
    """Append the comparison to the site's register; nothing when no pair was registered (surveys without cracks
    would say the site had none)."""
    if not registered:
        print(f"nothing appended to {register}: no pair was registered")
        return {"appended": False, "reason": "no pair was registered"}
    records = found.register
    if len(records.crs) > 1:
        raise InputError(f"--register {register}: the pairs lie in several CRSs or mix photos and rasters "
                         f"({', '.join(sorted(map(str, records.crs)))})")
    pairs = [{"before_image": row.get("name_before"), "after_image": row.get("name_after"), "status": row["status"]} for row in found.pairs]
    compared = history.Compared((records.before, records.after), records.links, pairs)
    added = history.append_comparison(register, *surveys, compared, next(iter(records.crs)), classes)
    return {"appended": True, **added}
