"""``crackseg compare``: two inspections of one structure, crack by crack."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crackseg.cli.options import HelpFormatter, checked, width_classes, width_classes_help
from crackseg.core.config import POSITIVE
from crackseg.core.errors import InputError
from crackseg.core.storage import display_url, is_url
from crackseg.cracks.vectors import FORMATS as VECTOR_FORMATS


def add_commands(commands) -> None:
    compare = commands.add_parser(
        "compare",
        help="compare two inspections of one structure: which cracks are new, longer, wider or gone",
        description=(
            "Compare two inspections of one structure. BEFORE and AFTER are each a folder written by\n"
            "crackseg predict, or a dataset folder (images/ + masks/). Images pair by relative name\n"
            "(--pairs CSV when names differ); a name on one side only is listed, not compared.\n\n"
            "Georeferenced rasters align by their map coordinates; photos of the same spot are\n"
            "registered by ORB features and RANSAC on a reduced copy. A pair that cannot be registered\n"
            "reliably is reported as 'unregistered' and not compared. Cracks are measured as predict\n"
            "measures them and matched by their centrelines; each gets a status: unchanged, longer,\n"
            "wider, longer+wider, merged, split, new or gone.\n\n"
            "Writes OUT/changes.csv (a row per crack), OUT/pairs.csv (a row per pair), OUT/summary.json;\n"
            "--vectors a change layer per pair, --report OUT/report.html, --register SITE.gpkg a\n"
            "GeoPackage that accumulates the surveys of one site.\n\n"
            "  crackseg compare visit1/ visit2/ --out changes/ --px-size 0.2 --report\n"
            "  crackseg compare visit2/ visit3/ --out changes23/ --register site.gpkg --before-date 2025-05-01 --after-date 2026-05-03"
        ),
        formatter_class=HelpFormatter,
    )
    compare.add_argument("before", help="the earlier inspection: a predictions folder or a dataset folder (or its s3:// prefix)")
    compare.add_argument("after", help="the later inspection, the same kinds")
    compare.add_argument("--out", required=True,
                         help="folder (or s3:// prefix) for changes.csv, pairs.csv, summary.json (created if missing)")
    compare.add_argument("--px-size", type=checked(float, POSITIVE), default=None,
                         help="mm per pixel of the AFTER photos: widths and lengths also in mm (BEFORE photos through the registration's "
                              "scale); georeferenced rasters use their own pixel size")
    compare.add_argument("--width-classes", type=width_classes, default=None,
                         help=width_classes_help("report each crack's class before and after and whether it changed, by the width "
                                                 "the standard grades (changes.csv: max_width_class_before/after, or "
                                                 "mean_width_class_before/after for a standard grading mean width)"))
    compare.add_argument("--pairs", default=None, help="CSV with a header 'before,after': the photo paths (or names) to pair")
    compare.add_argument("--transform", choices=("similarity", "affine", "homography"), default="similarity",
                         help="how photos may differ: similarity (shift, rotation, scale), affine, or homography (another viewpoint on a plane)")
    compare.add_argument("--vectors", choices=tuple(VECTOR_FORMATS), default=None,
                         help="also write OUT/vectors/<name>.geojson|gpkg: each crack's centreline with its status (gone cracks: "
                              "their BEFORE centreline), in map coordinates for rasters, else the AFTER image's pixels")
    compare.add_argument("--report", action="store_true", help="also write OUT/report.html: each pair side by side, cracks coloured by status")
    compare.add_argument("--register", default=None,
                         help="a GeoPackage crack register of the site (created if missing): adds both surveys, their cracks and the "
                              "links between a crack and its successor (see docs/compare.md)")
    compare.add_argument("--before-date", default=None, help="date of the BEFORE survey, YYYY-MM-DD (default: the EXIF DateTimeOriginal of its photos)")
    compare.add_argument("--after-date", default=None, help="date of the AFTER survey, YYYY-MM-DD (default: from EXIF, as for BEFORE)")
    compare.add_argument("--overwrite", action="store_true", help="replace the tables of an earlier compare in --out")
    compare.set_defaults(handler=_cmd_compare)


def _cmd_compare(args: argparse.Namespace) -> int:
    from crackseg.monitoring.compare import CompareOptions, compare_inspections

    if args.register is None and (args.before_date or args.after_date):
        raise InputError("--before-date and --after-date date the surveys of --register SITE.gpkg; give --register too")
    for flag, value in (("--register", args.register), ("--pairs", args.pairs)):
        if value is not None and is_url(value):  # the register is a SQLite file, written in place
            raise InputError(f"{flag} {display_url(value)}: must be a local file; object storage is for BEFORE, AFTER and --out")
    register, pairs = (None if value is None else Path(value) for value in (args.register, args.pairs))
    options = CompareOptions(args.px_size, args.width_classes, pairs, args.vectors, args.report, register,
                             (args.before_date, args.after_date), args.transform, args.overwrite)
    summary = compare_inspections(args.before, args.after, args.out, options)
    out = display_url(args.out).rstrip("/") if is_url(args.out) else Path(args.out)
    counts = ", ".join(f"{count} {status}" for status, count in summary["cracks"].items() if count)
    print(f"{summary['registered']} of {summary['pairs']} pairs compared ({counts or 'no cracks'}); "
          f"{len(summary['unregistered'])} not registered; written to {out}")
    if summary["failed"]:  # as predict: everything that could be compared is written, and the run says it is incomplete
        print(f"crackseg: error: {len(summary['failed'])} of {summary['pairs']} pairs failed; pairs.csv gives each one's reason: "
              f"{out}/pairs.csv", file=sys.stderr)
        return 1
    return 0
