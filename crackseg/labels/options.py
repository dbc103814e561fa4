"""The options of ``crackseg labels import|export|rank``; no numpy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.options import AT_LEAST_ONE, REQUIRED, Options, Range, group, option
from crackseg.labels.formats.reading import LABEL_FORMATS

LINE_WIDTH = Range(1, 10_000)  # px: no crack is wider, and PIL draws lines of some millions of px wrong


@dataclass(frozen=True)
class ImportOptions(Options):
    """How an annotation file's shapes become crack pixels, and whether an existing dataset is replaced."""

    line_width: int | None = option(None, "px: width to draw lines (CVAT polylines, labelme lines and linestrips) with; "
                                          "required when the file has crack lines without a 'width' attribute of their own "
                                          "(a CVAT polyline's wins)", unit="px", valid=LINE_WIDTH)
    labels: tuple[str, ...] = option(("crack",), "a label name that is crack, compared case-insensitively; repeat for several "
                                                 "(default: crack); other labels are left out and counted",
                                     flags=("--label",), repeat=True, metavar="NAME")
    overwrite: bool = option(False, "replace a dataset already in --out")


@dataclass(frozen=True)
class LabelImport(Options):
    """``crackseg labels import``."""

    annotations: Path = option(REQUIRED, "COCO .json, labelme .json file or folder of them, CVAT for images 1.1 .xml, or "
                                         "Label Studio JSON export", positional=True)
    format: str = option(REQUIRED, "the annotation file's format", choices=LABEL_FORMATS)
    images: Path = option(REQUIRED, "folder holding the photos the file names (sub-folders searched)")
    out: Path = option(REQUIRED, "dataset folder to write")
    options: ImportOptions = group(ImportOptions)


@dataclass(frozen=True)
class LabelExport(Options):
    """``crackseg labels export``."""

    predictions: Path = option(REQUIRED, "folder written by crackseg predict", positional=True)
    format: str = option(REQUIRED, "the labelling tool's format", choices=LABEL_FORMATS)
    out: Path = option(REQUIRED, "file to write (a folder for labelme)")
    rle: bool = option(False, "crack pixels exactly, as masks / brushes",
                       off=("--polygons", "crack outlines as polygons, editable by vertex (the default)"))
    image_prefix: str = option("", "text put before every image name in the file, e.g. /data/local-files/?d=photos/ for "
                                   "Label Studio's local storage")
    overwrite: bool = option(False, "replace files already at --out")


@dataclass(frozen=True)
class LabelRank(Options):
    """``crackseg labels rank``."""

    predictions: Path = option(REQUIRED, "folder written by crackseg predict --save-prob 8|16", positional=True)
    top: int = option(10, "photos to print; rank.csv lists all", valid=AT_LEAST_ONE)
    threshold: float | None = option(None, "decision threshold on crack probability (default: the one predict used, from "
                                           "summary.json); at 0 or 1 every pixel is sure",
                                    valid=Range(0, 1, low_open=True, high_open=True))
