"""What ``predict`` writes for each image, and for the whole run.

Per image: ``masks/<name>.png`` (the model's pixels, 0/255), optionally ``probs/<name>.png``
and ``overlays/<name>.jpg`` (the photo with each reported crack tinted and labelled with its
id), a row of ``predictions.csv`` and, when measuring, one row of ``cracks.csv`` per crack.
For the run: ``summary.json`` (totals, the widest crack, length per width class).

Cracks are what :func:`crackseg.measure.find_cracks` reports: pieces joined across short
gaps, specks under the minimum length left out of the tables and overlays (the mask keeps
every pixel the model marked).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from skimage.morphology import skeletonize

from crackseg.files import write_atomic
from crackseg.measure import CrackMeasure, WidthClasses, find_cracks
from crackseg.vectors import FORMATS, centrelines, skeleton_links, write_vectors

_TINT = np.array([255.0, 30.0, 30.0], np.float32)


@dataclass(frozen=True)
class OutputSpec:
    """Which files to write and how to measure, resolved to pixels."""

    save_prob: int | None = None  # 8 or 16 bits
    overlay: bool = False
    measure: bool = True
    px_size: float | None = None  # mm per pixel
    join_gap_px: float | None = 0.0  # None: given in mm, and there is no pixel size to convert it
    min_length_px: float | None = 0.0
    width_classes: WidthClasses | None = None
    vectors: str | None = None  # geojson or gpkg: crack centrelines per image


def outputs_of(out: Path, name: str, spec: OutputSpec) -> list[Path]:
    """The files one image gets: its mask first, then what the spec asks for."""
    paths = [out / "masks" / f"{name}.png"]
    if spec.save_prob:
        paths.append(out / "probs" / f"{name}.png")
    if spec.overlay:
        paths.append(out / "overlays" / f"{name}.jpg")
    if spec.vectors:
        paths.append(vector_path(out, name, spec.vectors))
    return paths


def vector_path(out: Path, name: str, fmt: str) -> Path:
    return out / "vectors" / f"{name}{FORMATS[fmt][1]}"


def write_image_outputs(
    out: Path, path: Path, name: str, image: torch.Tensor, prob: torch.Tensor, threshold: float, spec: OutputSpec
) -> tuple[dict, list[dict]]:
    """Write one image's files; returns its predictions.csv row and cracks.csv rows."""
    mask = (prob >= threshold).numpy()
    mask_path = out / "masks" / f"{name}.png"
    write_png(mask_path, mask.astype(np.uint8) * 255)
    if spec.save_prob:
        write_png(out / "probs" / f"{name}.png", probability_levels(prob, spec.save_prob))
    labels, cracks = find_cracks(mask, spec.join_gap_px, spec.min_length_px) if spec.measure else (None, [])
    if spec.overlay:
        write_atomic(out / "overlays" / f"{name}.jpg", overlay_jpeg(image, mask if labels is None else labels > 0, cracks))
    row, crack_rows = table_rows(path, mask_path, mask_counts(mask), cracks, spec, "ok")
    if spec.vectors:
        lines = centrelines(skeleton_links(skeletonize(labels > 0), labels))
        write_vectors(vector_path(out, name, spec.vectors), spec.vectors, crack_rows, lines, None)
    return row, crack_rows


def summarize_existing(path: Path, mask_path: Path, spec: OutputSpec) -> tuple[dict, list[dict]]:
    """The rows of an image whose outputs an earlier run wrote (``--skip-existing``)."""
    with Image.open(mask_path) as saved:
        mask = np.asarray(saved.convert("L")) > 127
    cracks = find_cracks(mask, spec.join_gap_px, spec.min_length_px)[1] if spec.measure else []
    return table_rows(path, mask_path, mask_counts(mask), cracks, spec, "skipped: exists")


def mask_counts(mask: np.ndarray) -> dict:
    """The columns of predictions.csv that come from the mask alone."""
    height, width = mask.shape
    return {"width": width, "height": height, "crack_fraction": round(float(mask.mean()), 6), "area_px": int(mask.sum())}


def table_rows(path: Path, mask_path: Path, counts: dict, cracks: list[CrackMeasure], spec: OutputSpec,
               status: str) -> tuple[dict, list[dict]]:
    """predictions.csv's row for one mask (``counts``: see :func:`mask_counts`) and, when measuring,
    cracks.csv's rows (mm and classes with a pixel size)."""
    row = {"path": str(path), "mask": str(mask_path), **{k: counts[k] for k in ("width", "height", "crack_fraction")}}
    if spec.measure:
        total_length = sum(c.length_px for c in cracks)
        row |= {
            "cracks": len(cracks),
            "length_px": round(total_length, 2),
            "mean_width_px": round(sum(c.mean_width_px * c.length_px for c in cracks) / total_length, 3) if total_length else 0.0,
            "max_width_px": round(max((c.max_width_px for c in cracks), default=0.0), 3),
        }
    row |= {k: v for k, v in counts.items() if k not in row}
    crack_rows = [
        {"path": str(path), "crack": c.id, "length_px": round(c.length_px, 2), "mean_width_px": round(c.mean_width_px, 3),
         "max_width_px": round(c.max_width_px, 3), "area_px": c.area_px, "fragments": c.fragments,
         "top": c.bbox[0], "left": c.bbox[1], "bottom": c.bbox[2], "right": c.bbox[3]}
        for c in cracks
    ]
    if spec.px_size is not None:
        for item in [row, *crack_rows]:
            for key in ("length", "mean_width", "max_width"):
                if f"{key}_px" in item:
                    item[f"{key}_mm"] = round(item[f"{key}_px"] * spec.px_size, 4)
            item["area_mm2"] = round(item["area_px"] * spec.px_size**2, 4)
    if spec.width_classes is not None and spec.px_size is not None:
        classes = spec.width_classes
        lengths = dict.fromkeys(classes.labels, 0.0)
        for item in crack_rows:
            item["max_width_class"] = classes.classify(item["max_width_mm"])
            item["mean_width_class"] = classes.classify(item["mean_width_mm"])
            lengths[item["max_width_class"]] += item["length_mm"]
        row |= {f"length_mm[{label}]": round(value, 4) for label, value in lengths.items()}
    row["status"] = status
    return row, crack_rows


def write_summary(out: Path, rows: list[dict], crack_rows: list[dict], spec: OutputSpec, warnings: list[str]) -> dict:
    """``summary.json``: what the run found, for people and for ``crackseg report``.

    ``spec`` is the run's: its pixel size is the one every image shares, or None; totals in mm
    are given when every image had a pixel size, its own or the run's.
    """
    summary: dict = {"images": len(rows), "px_size_mm": spec.px_size, "warnings": warnings}
    in_mm = bool(rows) and all("length_mm" in row for row in rows)
    if spec.measure:
        widest = max(crack_rows, key=lambda r: r["max_width_px"], default=None)
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
            by_class = dict.fromkeys(classes.labels, 0.0)
            for item in crack_rows:
                by_class[item["max_width_class"]] += item["length_mm"]
            summary["width_classes"] = {
                "name": classes.name, "edges_mm": list(classes.edges_mm), "labels": list(classes.labels), "by": "max width",
                "length_mm": {label: round(value, 4) for label, value in by_class.items()},
                "cracks": {label: sum(r["max_width_class"] == label for r in crack_rows) for label in classes.labels},
            }
    write_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


def overlay_jpeg(image: torch.Tensor, cracks_mask: np.ndarray, cracks: list[CrackMeasure]) -> bytes:
    """The photo with crack pixels tinted red and each crack's id written at it, for people to look at."""
    photo = image.permute(1, 2, 0).numpy().astype(np.float32)
    photo[cracks_mask] = 0.35 * photo[cracks_mask] + 0.65 * _TINT
    picture = Image.fromarray(photo.round().astype(np.uint8))
    if cracks:
        draw = ImageDraw.Draw(picture)
        font = ImageFont.load_default(size=max(10, min(picture.size) // 40))
        for crack in cracks:
            row, col = crack.anchor
            box = draw.textbbox((col + 3, row + 3), str(crack.id), font=font)
            draw.rectangle((box[0] - 2, box[1] - 1, box[2] + 2, box[3] + 1), fill=(255, 255, 255))
            draw.text((col + 3, row + 3), str(crack.id), fill=(180, 0, 0), font=font)
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def probability_levels(prob: torch.Tensor, bits: int) -> np.ndarray:
    """Probabilities as 8- or 16-bit grey levels (0 = 0, the top level = 1)."""
    if bits == 8:
        return (prob * 255).round().byte().numpy()
    return (prob.double() * 65535).round().numpy().astype(np.uint16)


def write_png(path: Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG", compress_level=1)
    write_atomic(path, buffer.getvalue())
