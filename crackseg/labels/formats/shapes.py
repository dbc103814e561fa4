"""What an annotation file holds, and each shape drawn as its tool draws it.

Every tool's reader returns :class:`Annotations` (the images as the file names them, with their
shapes), the points kept in that tool's coordinates (each tool module's docstring says which);
:func:`paint` puts them where the tool puts them (a one-pixel example per format in
tests/labels/test_loop.py pins it). Lines are drawn ``line_width`` px wide through the points with
PIL (edge coordinates moved half a pixel onto centres).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from crackseg.core.errors import InputError, require


@dataclass
class Shape:
    """One annotated shape. ``kind`` polygon, line or mask is drawn; any other (rectangle, point, ...) is counted only."""

    label: str
    kind: str
    points: np.ndarray | None = None  # (N, 2) x, y in px, in the format's coordinates
    centres: bool = False  # labelme: points are pixel centres, and PIL draws the outline too
    width: float | None = None  # px: a line's own width (a CVAT attribute "width")
    patch: np.ndarray | None = None  # a mask's pixels (h, w) bool
    rle: dict | None = None  # or a COCO RLE of the whole image (compressed)
    origin: tuple[int, int] = (0, 0)  # the patch's (left, top) in the image


@dataclass
class LabelledImage:
    name: str  # as the file names it: a path, a URL, a Label Studio upload
    size: tuple[int, int] | None  # (width, height) as the file states it
    shapes: list[Shape] = field(default_factory=list)
    embedded_in: Path | None = None  # labelme: the .json whose imageData holds the photo itself (read on demand)


@dataclass
class Annotations:
    images: list[LabelledImage]
    labels: set[str]  # label names the file defines or uses
    unlabelled: int = 0  # Label Studio tasks without a submitted annotation (not imported)
    cancelled: int = 0  # Label Studio annotations cancelled or skipped (not imported)
    several: int = 0  # Label Studio tasks with several submitted annotations, of which one was imported
    other_json: int = 0  # .json files in a labelme folder that are not labelme annotations (no shapes list)


def load_json(path: Path):
    """A JSON file's content; a file that is not JSON is one InputError naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: not readable JSON ({error})") from None


def stated_size(width, height) -> tuple[int, int] | None:
    """(width, height) in px as a file states them, or None when it leaves either out."""
    return (int(width), int(height)) if width is not None and height is not None else None


def paint_all(canvas: np.ndarray, shapes: list[Shape], line_width: float | None = None) -> list[tuple[int, bool]]:
    """:func:`paint` for each shape; COCO RLEs are merged and decoded once (each covers the whole image)."""
    rles = [shape.rle for shape in shapes if shape.rle is not None]
    areas = iter([])
    if rles:
        masks = require("pycocotools.mask", "labels", "reading COCO RLE")
        if any(list(rle["size"]) != list(canvas.shape) for rle in rles):
            raise ValueError(f"a COCO RLE of another size than its {canvas.shape[1]}x{canvas.shape[0]} image")
        canvas |= masks.decode(masks.merge(rles)).astype(bool)
        areas = iter([masks.area(rle) for rle in rles])  # one by one: pycocotools 2.0.11 fails on lists over 255
    return [(int(next(areas)), False) if shape.rle is not None else paint(canvas, shape, line_width) for shape in shapes]


def paint(canvas: np.ndarray, shape: Shape, line_width: float | None = None) -> tuple[int, bool]:
    """Draw a polygon, line or mask on ``canvas`` ((H, W) bool) as its tool draws it.

    Returns (the pixels it covers in the image, whether part of it lies outside the image).
    """
    height, width = canvas.shape
    if shape.kind == "mask":
        left, top = shape.origin
        rows, cols = shape.patch.shape
        inside = shape.patch[max(0, -top) : max(0, height - top), max(0, -left) : max(0, width - left)]
        window = canvas[max(0, top) : max(0, top) + inside.shape[0], max(0, left) : max(0, left) + inside.shape[1]]
        window |= inside
        return int(inside.sum()), left < 0 or top < 0 or left + cols > width or top + rows > height
    points = shape.points if shape.centres else shape.points - 0.5 * (shape.kind == "line")  # lines are drawn on centres
    stroke = max(1, int((shape.width or line_width or 1) + 0.5)) if shape.kind == "line" else 0  # PIL draws whole px
    low, high = (-0.5, np.array([width, height]) - 0.5) if shape.centres or shape.kind == "line" else (0.0, np.array([width, height]))
    clipped = bool(len(points)) and bool((points - stroke / 2 < low).any() or (points + stroke / 2 > high).any())
    if len(points) < (2 if shape.kind == "line" else 3) or not np.isfinite(points).all():
        return 0, clipped
    x0, y0 = np.maximum(np.floor(points.min(axis=0)).astype(int) - stroke - 1, 0)
    x1, y1 = np.minimum(np.ceil(points.max(axis=0)).astype(int) + stroke + 2, [width, height])
    if x1 <= x0 or y1 <= y0:
        return 0, clipped
    local = points - [x0, y0]
    if shape.kind == "polygon" and not shape.centres:
        masks = require("pycocotools.mask", "labels", "drawing polygons as pycocotools does")
        drawn = masks.decode(masks.frPyObjects([local.ravel().tolist()], int(y1 - y0), int(x1 - x0)))[:, :, 0].astype(bool)
    else:
        picture = Image.new("L", (int(x1 - x0), int(y1 - y0)), 0)
        xy = [tuple(point) for point in local.tolist()]
        if shape.kind == "polygon":
            ImageDraw.Draw(picture).polygon(xy, outline=1, fill=1)  # labelme's shape_to_mask
        else:
            ImageDraw.Draw(picture).line(xy, fill=1, width=stroke, joint=None if shape.centres else "curve")
        drawn = np.asarray(picture, dtype=bool)
    canvas[y0:y1, x0:x1] |= drawn
    return int(drawn.sum()), clipped
