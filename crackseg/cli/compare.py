"""``crackseg compare``: two inspections of one structure, crack by crack."""

from __future__ import annotations

import sys

from crackseg.cli.options import add_command
from crackseg.core.urls import shown_location
from crackseg.monitoring.options import CompareOptions


def add_commands(commands) -> None:
    add_command(
        commands, "compare", "compare two inspections of one structure: which cracks are new, longer, wider or gone",
        (
            "Compare two inspections of one structure. BEFORE and AFTER are each a folder written by\n"
            "crackseg predict, or a dataset folder (images/ + masks/). Images pair by relative name\n"
            "(--pairs CSV when names differ); a name on one side only is listed, not compared.\n\n"
            "Georeferenced rasters align by their map coordinates; photos of the same spot are\n"
            "registered by ORB features and RANSAC on a reduced copy. A pair that cannot be registered\n"
            "reliably is reported as 'unregistered' and not compared. Cracks are measured as predict\n"
            "measures them and matched by their centrelines; each gets a status: unchanged, shorter,\n"
            "longer, wider, longer+wider, merged, split, new, gone or not seen.\n\n"
            "Writes OUT/changes.csv (a row per crack), OUT/pairs.csv (a row per pair), OUT/summary.json;\n"
            "--vectors a change layer per pair, --report OUT/report.html, --register SITE.gpkg a\n"
            "GeoPackage that accumulates the surveys of one site.\n\n"
            "  crackseg compare visit1/ visit2/ --out changes/ --px-size 0.2 --report\n"
            "  crackseg compare visit2/ visit3/ --out changes23/ --register site.gpkg --before-date 2025-05-01 --after-date 2026-05-03"
        ),
        CompareOptions, _cmd_compare,
    )


def _cmd_compare(options: CompareOptions) -> int:
    from crackseg.monitoring.compare import compare_inspections

    summary = compare_inspections(options)
    out = shown_location(options.out)
    counts = ", ".join(f"{count} {status}" for status, count in summary["cracks"].items() if count)
    print(f"{summary['registered']} of {summary['pairs']} pairs compared ({counts or 'no cracks'}); "
          f"{len(summary['unregistered'])} not registered; written to {out}")
    if summary["failed"]:  # as predict: everything that could be compared is written, and the run says it is incomplete
        print(f"crackseg: error: {len(summary['failed'])} of {summary['pairs']} pairs failed; pairs.csv gives each one's reason: "
              f"{out}/pairs.csv", file=sys.stderr)
        return 1
    return 0
