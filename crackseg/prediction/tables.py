"""The tables of a predictions folder: predictions.csv's row per image and cracks.csv's row per crack, their columns,
and summary.json's totals, as :class:`~crackseg.prediction.outputs.PredictionsFolder` writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from crackseg.core.files import write_atomic
from crackseg.cracks.measure import CrackMeasure
from crackseg.cracks.widths import WidthClasses, in_mm
from crackseg.prediction.uncertainty import uncertainty

if TYPE_CHECKING:
    from crackseg.prediction.outputs import OutputSpec, PredictionsFolder


def mask_counts(mask: np.ndarray) -> dict:
    """The columns of predictions.csv that come from the mask alone."""
    height, width = mask.shape
    return {"width": width, "height": height, "crack_fraction": round(float(mask.mean()), 6), "area_px": int(mask.sum())}


def table_rows(path: Path, mask_path: Path, counts: dict, cracks: list[CrackMeasure], spec: OutputSpec,
               status: str) -> tuple[dict, list[dict]]:
    """predictions.csv's row for one mask (``counts``: see :func:`mask_counts`) and, when measuring,
    cracks.csv's rows (mm and classes with a pixel size)."""
    row = {"path": str(path), "mask": str(mask_path), **{k: counts[k] for k in ("width", "height", "crack_fraction")}}
    found = {}  # the image's measures as found: its mm come from these, as its cracks' mm do, not from rounded px
    if spec.measure:
        total_length = sum(c.length_px for c in cracks)
        found = {"length_px": total_length, "max_width_px": max((c.max_width_px for c in cracks), default=0.0),
                 "mean_width_px": sum(c.mean_width_px * c.length_px for c in cracks) / total_length if total_length else 0.0}
        row |= {"cracks": len(cracks)} | {key: round(found[key], 2 if key == "length_px" else 3) for key in ("length_px", "mean_width_px", "max_width_px")}
    row |= {k: v for k, v in counts.items() if k not in row}
    crack_rows = [
        {"path": str(path), "crack": c.id, "length_px": round(c.length_px, 2), "mean_width_px": round(c.mean_width_px, 3),
         "max_width_px": round(c.max_width_px, 3), "area_px": c.area_px, "fragments": c.fragments,
         "top": c.bbox[0], "left": c.bbox[1], "bottom": c.bbox[2], "right": c.bbox[3]}
        for c in cracks
    ]
    if spec.px_size is not None:
        row |= in_mm(row | found, spec.px_size)
        for item, crack in zip(crack_rows, cracks):  # from the sizes as found, as compare and the register convert them
            item |= in_mm({"length_px": crack.length_px, "mean_width_px": crack.mean_width_px, "max_width_px": crack.max_width_px,
                           "area_px": crack.area_px}, spec.px_size)
    if spec.width_classes is not None and spec.px_size is not None:
        classes = spec.width_classes
        for item in crack_rows:
            item["max_width_class"] = classes.classify(item["max_width_mm"])
            item["mean_width_class"] = classes.classify(item["mean_width_mm"])
        row |= {f"length_mm[{label}]": length for label, length in _length_by_class(classes, crack_rows).items()}
    row["status"] = status
    return row, crack_rows


def table_columns(spec: OutputSpec) -> tuple[list[str], list[str]]:
    """The columns of predictions.csv and cracks.csv for a photo predicted with ``spec``, as :func:`table_rows` makes
    them: a table without rows (every input failed; a survey of crack-free walls) still has them all."""
    counts = mask_counts(np.zeros((1, 1), bool)) | (uncertainty(np.zeros((1, 1), np.float32), 0.5) if spec.save_prob else {})
    crack = CrackMeasure(id=1, length_px=1.0, mean_width_px=1.0, max_width_px=1.0, area_px=1, bbox=(0, 0, 1, 1), anchor=(0, 0), fragments=1)
    row, crack_rows = table_rows(Path(), Path(), counts, [crack], spec, "")
    return list(row), list(crack_rows[0])


def _length_by_class(classes: WidthClasses, crack_rows: list[dict]) -> dict[str, float]:
    """Length in mm per class of the width the standard grades (its ``graded_column`` of cracks.csv)."""
    lengths = dict.fromkeys(classes.labels, 0.0)
    for item in crack_rows:
        lengths[item[classes.graded_column]] += item["length_mm"]
    return {label: round(length, 4) for label, length in lengths.items()}


def write_summary(folder: PredictionsFolder, rows: list[dict], crack_rows: list[dict], spec: OutputSpec, warnings: list[str],
                  threshold: float | None = None) -> dict:
    """``summary.json``: what the run found, for people and for ``crackseg report``.

    ``spec`` is the run's: its pixel size is the one every image shares, or None; totals in mm
    are given when every image had a pixel size, its own or the run's.
    """
    summary: dict = {"images": len(rows), "px_size_mm": spec.px_size, "warnings": warnings,
                     "working_folder": os.getcwd()}  # where predictions.csv's relative photo paths start
    if threshold is not None:
        summary["threshold"] = threshold  # the masks' decision threshold, which crackseg labels rank measures from
    in_mm = bool(rows) and all("length_mm" in row for row in rows)
    if spec.measure:
        widest = max(crack_rows, key=lambda r: r["max_width_mm" if in_mm else "max_width_px"], default=None)  # rasters' scales differ
        summary |= {
            "cracks": len(crack_rows),
            "length_px": round(sum(r["length_px"] for r in crack_rows), 2),
            "widest": {key: widest[key] for key in ("path", "crack", "max_width_px", "max_width_mm") if key in widest} if widest else None,
            "join_gap_px": spec.join_gap_px,
            "min_length_px": spec.min_length_px,
        }
        if in_mm:
            summary["length_mm"] = round(sum(r["length_mm"] for r in crack_rows), 4)
        if spec.width_classes is not None and in_mm:
            classes = spec.width_classes
            summary["width_classes"] = classes.as_dict() | {
                "length_mm": _length_by_class(classes, crack_rows),
                "cracks": {label: sum(r[classes.graded_column] == label for r in crack_rows) for label in classes.labels},
            }
    write_atomic(folder.summary_json, json.dumps(summary, indent=1) + "\n")
    return summary
