"""The images of one inspection, and how the images of two inspections pair.

An inspection folder is a ``predict`` output folder or a dataset (``images/`` + ``masks/``). In a
predictions folder, predictions.csv names each mask and its photo as predict wrote them, from its
own working folder, and summary.json gives the join gap and minimum length predict measured with,
so that compare's crack ids are those of its cracks.csv; a dataset is measured with predict's
defaults. An image's name is its mask's path under ``masks/`` without the suffix. Two inspections'
images pair by name, or by a CSV of before,after cells that name an image by name, path, or a file
name only one image has; each image is compared once. An image that cannot be compared (one the dataset reader
cannot pair, one predict failed on) is kept with its reason, so that its pair fails saying why instead of the
other visit's image looking alone.
Without a date given, a survey is dated by the earliest EXIF DateTimeOriginal of its photos.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from crackseg.core.errors import InputError
from crackseg.core.files import read_csv
from crackseg.cracks.options import JOIN_GAP, MIN_LENGTH
from crackseg.data.images import DECODE_ERRORS, IMAGE_SUFFIXES
from crackseg.data.inputs import paths_below
from crackseg.prediction.outputs import PredictionsFolder


@dataclass(frozen=True)
class Shot:
    """One image of one inspection: the name it pairs by, its mask, its photo, how its cracks were measured.

    The join gap and minimum length are predict's, in px; for rasters of several pixel sizes measured with
    lengths in mm predict has no px value (None), and each raster converts the mm value by its own pixel size.
    """

    name: str
    mask: Path
    photo: Path | None
    join_gap_px: float | None
    min_length_px: float | None
    join_gap_mm: float | None = None
    min_length_mm: float | None = None


@dataclass(frozen=True)
class LeftOut:
    """Images of an inspection that cannot be compared: the names they would pair by, the file or folder, and why."""

    names: tuple[str, ...]
    path: Path
    reason: str


@dataclass(frozen=True)
class Visit:
    """One inspection: the shots to compare, and what of it cannot be compared."""

    shots: list[Shot]
    left_out: list[LeftOut]

    def left_out_as(self, name: str) -> LeftOut | None:
        return next((left for left in self.left_out if name in left.names), None)


def read_visit(folder: Path, flag: str) -> Visit:
    """The shots of one inspection: a predictions folder (predictions.csv) or a dataset (images/ + masks/)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{flag} {folder}: not a folder")
    predictions = PredictionsFolder(folder)
    if predictions.predictions_csv.exists():
        shots = _predicted_shots(predictions)
        left_out = _failed_predictions(predictions, {shot.name for shot in shots})
    elif (folder / "images").is_dir() and (folder / "masks").is_dir():
        shots, left_out = _dataset_shots(folder)
    else:
        raise InputError(f"{flag} {folder}: neither a predictions folder (predictions.csv) nor a dataset (images/ and masks/)")
    if not shots:
        raise InputError(f"{flag} {folder}: no image with a mask in it" + (f" ({left_out[0].path}: {left_out[0].reason})" if left_out else ""))
    return Visit(shots, left_out)


def _dataset_shots(folder: Path) -> tuple[list[Shot], list[LeftOut]]:
    """A dataset's shots, measured with predict's defaults, and what the dataset reader could not pair (a subfolder's
    images by their paths below it, as a predictions folder names them)."""
    from crackseg.data.pairing import find_samples  # data loads torch, which compare needs for dataset folders only

    samples, problems = find_samples(folder / "images", folder / "masks")
    shots = [Shot(sample.stem, sample.mask, sample.image, JOIN_GAP.value, MIN_LENGTH.value) for sample in samples]
    left_out = []
    for problem in problems:
        path = Path(problem.path)
        top = next(top for top in (folder / "images", folder / "masks") if path.is_relative_to(top))
        files = sorted(file for file in paths_below(path) if file.is_file() and file.suffix.lower() in IMAGE_SUFFIXES) if path.is_dir() else [path]
        left_out.append(LeftOut(tuple(file.relative_to(top).with_suffix("").as_posix() for file in files), path, problem.message))
    return shots, left_out


def _failed_predictions(folder: PredictionsFolder, predicted: set[str]) -> list[LeftOut]:
    """The photos errors.csv lists (predict failed on them), by the output name it records (none in an errors.csv
    written before it had the column)."""
    try:
        rows = read_csv(folder.errors_csv, ("path", "error")) if folder.errors_csv.is_file() else []
    except InputError:
        rows = []
    return [LeftOut((row["name"],) if row.get("name") and row["name"] not in predicted else (), Path(row["path"]),
                    f"predict failed on it ({row['error']}; {folder.errors_csv})") for row in rows]


def _predicted_shots(folder: PredictionsFolder) -> list[Shot]:
    lengths = _predicted_lengths(folder)
    shots = []
    for number, row in enumerate(folder.read_predictions(), start=1):
        mask = folder.table_path(row.get("mask") or "", "mask", number)
        relative = mask.relative_to(folder.root / "masks")
        shots.append(Shot(relative.with_suffix("").as_posix(), mask, folder.photo(row["path"]) if row.get("path") else None, **lengths))
    return shots


def _predicted_lengths(folder: PredictionsFolder) -> dict:
    """The join gap and minimum length predict measured with (Shot's fields), from its summary.json.

    A null px value means predict had the length in mm for rasters of several pixel sizes: each raster
    converts the mm value by its own pixel size where the summary records it; else predict's defaults
    are used, and crack ids may differ from cracks.csv (said once, on stderr).
    """
    try:
        summary = json.loads(folder.summary_json.read_text())
    except (OSError, ValueError):
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    lengths, unknown = {}, []
    for key, default in (("join_gap", JOIN_GAP), ("min_length", MIN_LENGTH)):
        px, mm = summary.get(f"{key}_px"), summary.get(f"{key}_mm")
        if px is None and mm is None:
            if f"{key}_px" in summary:
                unknown.append(f"{key}_px")
            px = default.value
        lengths |= {f"{key}_px": None if px is None else float(px), f"{key}_mm": None if px is not None or mm is None else float(mm)}
    if unknown:
        print(f"crackseg: warning: {folder.summary_json}: {' and '.join(unknown)} null (lengths in mm for rasters of several "
              f"pixel sizes), and no mm value recorded; measuring with predict's defaults, so crack ids may differ from "
              f"{folder.cracks_csv}", file=sys.stderr)
    return lengths


def pair_shots(before: list[Shot], after: list[Shot], pairs_csv: Path | None) -> tuple[list[tuple[Shot, Shot]], list[tuple[str, Shot]]]:
    """The pairs to compare (those --pairs lists, then the others by name) and the shots present on one side only, as
    ("before" | "after", shot)."""
    paired = _listed_pairs(before, after, Path(pairs_csv)) if pairs_csv is not None else []
    listed = {id(shot) for pair in paired for shot in pair}
    by_name = {shot.name: shot for shot in after if id(shot) not in listed}
    paired += [(shot, by_name[shot.name]) for shot in before if id(shot) not in listed and shot.name in by_name]
    if not paired:
        raise InputError(f"nothing pairs: BEFORE has {_names(before)} and AFTER has {_names(after)}; "
                         "give --pairs CSV (before,after) when names differ between visits")
    used = {id(shot) for pair in paired for shot in pair}
    alone = [("before", shot) for shot in before if id(shot) not in used] + [("after", shot) for shot in after if id(shot) not in used]
    return paired, alone


def _names(shots: list[Shot]) -> str:
    return ", ".join(shot.name for shot in shots[:3]) + (f" and {len(shots) - 3} more" if len(shots) > 3 else "")


def _listed_pairs(before: list[Shot], after: list[Shot], path: Path) -> list[tuple[Shot, Shot]]:
    """Pairs from a CSV with the columns before,after (UTF-8, with or without Excel's byte order mark), each cell a
    shot's name or its photo's path; a shot is compared once."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(file)
            lines = [(reader.line_num, [cell.strip() for cell in cells]) for cells in reader]
    except OSError as error:
        raise InputError(f"--pairs {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise InputError(f"--pairs {path}: not UTF-8 text; save it as CSV UTF-8") from None
    except csv.Error as error:
        raise InputError(f"--pairs {path}: not a readable CSV ({error})") from None
    for line, cells in lines:  # csv reads NUL bytes as text, and a path holding one is a ValueError wherever it is used
        if any("\0" in cell for cell in cells):
            raise InputError(f"--pairs {path}, line {line}: holds a NUL byte, which no name or path has; save it as CSV UTF-8")
    header = lines[0][1] if lines else []
    rows = [(line, cells) for line, cells in lines[1:] if any(cells)]
    if not rows or not {"before", "after"} <= set(header):
        raise InputError(f"--pairs {path}: needs a header line 'before,after' and one row per pair")
    columns = header.index("before"), header.index("after")
    sides = ("BEFORE", "AFTER")
    finders = [_shot_finder(shots, side, path) for shots, side in zip((before, after), sides)]
    paired, listed = [], {}  # (side, id of a shot) -> the line that paired it
    for line, cells in rows:
        where = f"--pairs {path}, line {line}"
        if len(cells) <= max(columns) or not all(cells[column] for column in columns):
            raise InputError(f"{where}: needs a before and an after cell")
        pair = tuple(find(cells[column], where) for find, column in zip(finders, columns))
        earlier = [listed.get((side, id(shot))) for side, shot in zip(sides, pair)]
        if earlier[0] is not None and earlier[0] == earlier[1]:
            raise InputError(f"{where}: the pair {pair[0].name},{pair[1].name} is listed twice (also on line {earlier[0]})")
        for side, shot, other in zip(sides, pair, earlier):
            if other is not None:
                raise InputError(f"{where}: {shot.name} of {side} is already paired on line {other}; each image is compared once")
            listed[side, id(shot)] = line
        paired.append(pair)
    return paired


def _shot_finder(shots: list[Shot], side: str, csv_path: Path):
    """A function (cell text, where) -> the shot it names: the exact name; else the exact path, relative to the CSV's
    folder or to the working folder; else the one shot whose photo's or mask's path ends in the cell's (a file name, or
    ``images/a.jpg`` inside the visit's folder: never another visit's ``v1/images/a.jpg`` by its file name alone)."""
    by_name = {shot.name: shot for shot in shots}
    files = [(file, shot) for shot in shots for file in (shot.photo, shot.mask) if file is not None]
    by_path = {}
    for file, shot in files:
        by_path.setdefault(file.resolve(), shot)

    def find(text: str, where: str) -> Shot:
        if text in by_name:
            return by_name[text]
        for candidate in ((csv_path.parent / text).resolve(), Path(text).resolve()):
            if candidate in by_path:
                return by_path[candidate]
        tail = [part for part in Path(text).parts if part != "."]
        named = list({id(shot): shot for file, shot in files if tail and list(file.parts[-len(tail):]) == tail}.values())
        if len(named) > 1:
            raise InputError(f"{where}: {text!r} is ambiguous: {side} has {len(named)} images named {Path(text).name} "
                             f"({_names(named)}); give the name or the path")
        if not named:
            raise InputError(f"{where}: {text!r} is not an image of {side}")
        return named[0]

    return find


def survey_dates(visits: tuple[list[Shot], list[Shot]], given: tuple[str | None, str | None]) -> tuple[str, str]:
    """Each inspection's date: the flag, else the earliest EXIF DateTimeOriginal of its photos."""
    dates = []
    for side, visit, date in zip(("before", "after"), visits, given):
        if date is None:
            needed = f"--register needs the {side.upper()} inspection's date: its photos"
            photos = [shot.photo for shot in visit if shot.photo is not None and shot.photo.exists()]
            if not photos:
                missing = next((shot.photo for shot in visit if shot.photo is not None), None)
                raise InputError(f"{needed} were not found{f' (e.g. {missing})' if missing else ''}; give --{side}-date YYYY-MM-DD")
            taken = [day for photo in photos if (day := _exif_day(photo))]
            if not taken:
                raise InputError(f"{needed} carry no EXIF DateTimeOriginal; give --{side}-date YYYY-MM-DD")
            date = min(taken)
        dates.append(date)
    well_formed = all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) for date in dates)  # else the register says which is not a date
    if well_formed and dates[1] <= dates[0] and None in given:  # the register would name flags the user did not give
        source = " and ".join(f"{side.upper()}'s {'--' + side + '-date' if day else 'photos (EXIF)'} {date}"
                              for side, day, date in zip(("before", "after"), given, dates))
        raise InputError(f"--register: the AFTER inspection is not later than BEFORE ({source}); compare the earlier visit "
                         "with the later one, or give --before-date and --after-date")
    return dates[0], dates[1]


def _exif_day(photo: Path) -> str | None:
    try:
        with Image.open(photo) as image:
            taken = image.getexif().get_ifd(0x8769).get(36867)  # Exif IFD, DateTimeOriginal "YYYY:MM:DD HH:MM:SS"
        return dt.datetime.strptime(str(taken).strip()[:10], "%Y:%m:%d").date().isoformat() if taken else None
    except (*DECODE_ERRORS, ValueError):
        return None
