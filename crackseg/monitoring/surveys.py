"""The register's surveys: what a visit is (its date, its inspection folder, the scale it was measured in) and which
visits a register takes: in date order, each inspection once under one date, the survey two comparisons share measured
in one scale and graded by one standard. Its folder is stored relative to the register's (a project moved whole keeps
its register) and read back as an absolute path, as compare names the inspections it is given.

:mod:`crackseg.monitoring.history` appends; these are its rules and the rows of its ``surveys`` table.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sqlite3
from dataclasses import dataclass
from datetime import date as calendar_date
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError
from crackseg.core.files import readable
from crackseg.core.urls import is_url

SCALE_COLUMNS = {"px_size_mm": "REAL", "width_classes": "TEXT"}  # a survey's scale and standard, as given to compare


@dataclass(frozen=True)
class Survey:
    """One visit of the site: its date (YYYY-MM-DD), the inspection folder its cracks were measured from, and the scale
    they were measured in: --px-size (None: pixels, or each raster's own) and --width-classes ("" for none)."""

    date: str
    source: str
    px_size_mm: float | None = None
    width_classes: str = ""


@dataclass(frozen=True)
class RegisteredSurvey:
    survey: int
    date: str
    source: str
    px_size_mm: float | None
    width_classes: str | None  # None: a register written before the scale was recorded


def placed(*surveys: Survey) -> list[Survey]:
    """The surveys with a local source as an absolute path, as registered sources are read back."""
    return [survey if is_url(survey.source) else dataclasses.replace(survey, source=os.path.abspath(survey.source)) for survey in surveys]


def check_dates(before: Survey, after: Survey) -> None:
    _check_date(before.date, "--before-date")
    _check_date(after.date, "--after-date")
    if after.date <= before.date:
        raise InputError(f"--after-date {after.date}: not later than --before-date {before.date}")


def _check_date(text: str, flag: str) -> None:
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            calendar_date.fromisoformat(text)
            return
    except ValueError:
        pass
    raise InputError(f"{flag} {text}: not a date; give it as YYYY-MM-DD (e.g. 2024-05-31)")


def registered_surveys(db: sqlite3.Connection, register: Path) -> list[RegisteredSurvey]:
    """The surveys, each source an absolute path (or a URL) as compare names the inspections it is given."""
    have = {row[1] for row in db.execute('PRAGMA table_info("surveys")')}
    scale = ", ".join(name if name in have else "NULL" for name in SCALE_COLUMNS)  # a register older than them
    folder = Path(register).resolve().parent
    return [RegisteredSurvey(survey, date, source if is_url(source) else os.path.normpath(os.path.join(folder, source)), *rest)
            for survey, date, source, *rest in db.execute(f"SELECT survey, date, source, {scale} FROM surveys")]


def check_surveys(register: Path, registered: list[RegisteredSurvey], before: Survey, after: Survey) -> int | None:
    """The survey id of BEFORE when the register has it as its latest survey, None when BEFORE is a new, later one.
    Each inspection (its folder) is registered once, under one date."""
    if before.source == after.source:
        raise InputError(f"{register}: BEFORE and AFTER are the same inspection {after.source}; a register holds each inspection "
                         "once, under one date: compare two visits")
    if any((survey.date, survey.source) == (after.date, after.source) for survey in registered):
        raise InputError(f"{register}: the survey of {after.date} from {after.source} is already registered; nothing appended")
    for side, flag in ((after, "--after-date"), (before, "--before-date")):
        other = next((survey for survey in registered if survey.source == side.source and survey.date != side.date), None)
        if other is not None:
            raise InputError(f"{register}: {side.source} is registered already as the survey of {other.date}, not {side.date} "
                             f"({flag}); a register holds each inspection once: date it {other.date}, or keep each visit in a "
                             "folder of its own")
    if not registered:
        return None
    latest = max(registered, key=lambda survey: survey.date)
    shared = (before.date, before.source) == (latest.date, latest.source)
    if shared or before.date > latest.date:
        _check_standard(register, latest, before)
        return latest.survey if shared else None
    raise InputError(f"{register}: its latest survey is {latest.date} from {latest.source}; visits are appended in date order, "
                     f"so compare from that survey or a later one, not from {before.date} ({before.source})")


def _check_standard(register: Path, latest: RegisteredSurvey, before: Survey) -> None:
    """A comparison from the register's latest survey, or from a new, later one, is measured in mm where that survey is,
    in pixels where it is not, and graded by its standard: the register's mm columns, classes and QGIS style would mix
    them otherwise. Its pixel size may differ: --px-size is the AFTER photos' (another camera), BEFORE's come through
    the registration's scale."""
    if latest.width_classes is None:
        return
    if latest.width_classes != before.width_classes:
        given = f"--width-classes {before.width_classes}" if before.width_classes else "no --width-classes"
        recorded = f"--width-classes {latest.width_classes}" if latest.width_classes else "no --width-classes"
        raise InputError(f"{register}: its surveys are graded with {recorded} (the latest, {latest.date}), this comparison with {given}; "
                         "a register holds its site in one standard: give the --width-classes the register was made with")
    if (latest.px_size_mm is None) != (before.px_size_mm is None):
        raise InputError(f"{register}: its latest survey ({latest.date}) was measured "
                         f"{'in pixels (no --px-size)' if latest.px_size_mm is None else f'in mm (--px-size {latest.px_size_mm:g})'}, "
                         f"this comparison {'in pixels (no --px-size)' if before.px_size_mm is None else 'in mm (--px-size)'}; "
                         "a register holds its site in one unit: give --px-size to both or neither")


def survey_columns(surveys: list[tuple[int, Survey]], register: Path) -> dict[str, np.ndarray]:
    """The surveys' rows, a local source relative to the register's folder: a project moved whole keeps its register."""
    def stored(source: str) -> str:
        return source if is_url(source) else os.path.relpath(source, Path(register).resolve().parent)

    return {"survey": np.array([number for number, _ in surveys], np.int64),
            "date": np.array([survey.date for _, survey in surveys], object),
            "source": np.array([readable(stored(str(survey.source))) for _, survey in surveys], object),
            "px_size_mm": np.array([math.nan if survey.px_size_mm is None else survey.px_size_mm for _, survey in surveys], np.float64),
            "width_classes": np.array([survey.width_classes for _, survey in surveys], object)}
