"""What an annotation file holds, and each shape drawn as its tool draws it.

Every tool's reader returns :class:`Annotations` (the images as the file names them, with their
shapes), the points kept in that tool's coordinates (each tool module's docstring says which);
:func:`paint_all` puts them where the tool puts them (a one-pixel example per format in
tests/labels/test_loop.py pins it). Lines are drawn ``line_width`` px wide through the points with
PIL (edge coordinates moved half a pixel onto centres).

Bounds (docs/labels.md), so that a file cannot make import allocate more than its photos: readers
refuse coordinates that are not finite (:func:`finite_points`) and masks larger than their image
(:func:`check_mask_box`, :class:`DeferredPatch`), and :func:`paint_all` clips outlines that reach too far
before rasterizing (pycocotools' polygons at the image's edges when their outline passes
COCO_STEP_LIMIT, PIL's outlines and lines PIL_MARGIN px out): pycocotools takes all memory for a
vertex at 1e8 px, and PIL draws a line through one a pixel off. Any other shape is drawn whole, on the
whole image as its tool draws it: drawing in a box around it moves a pixel now and then.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from crackseg.core.errors import InputError, require

PIL_MARGIN = 1 << 20  # px beyond the image where PIL's outlines are cut: PIL draws a line through 1e8 px wrong, 1e7 right
COCO_GRID = 5  # pycocotools' rleFrPoly snaps each vertex to a 1/5 px grid: (int)(5 * x + .5), cast toward zero as C does
COCO_STEP_LIMIT = 10_000_000  # steps along an outline on that grid (16 bytes each in pycocotools) drawn whole: 2e6 px


@dataclass
class Shape:
    """One annotated shape. ``kind`` polygon, line or mask is drawn; any other (rectangle, point, ...) is counted only."""

    label: str
    kind: str
    points: np.ndarray | None = None  # (N, 2) x, y in px, in the format's coordinates
    centres: bool = False  # labelme: points are pixel centres, and PIL draws the outline too
    width: float | None = None  # px: a line's own width (a CVAT attribute "width")
    refused: str | None = None  # why the shape cannot be drawn as the file gives it: an error if it is a crack's
    patch: np.ndarray | DeferredPatch | None = None  # a mask's pixels (h, w) bool
    rle: dict | None = None  # or a COCO RLE of the whole image (compressed)
    origin: tuple[int, int] = (0, 0)  # the patch's (left, top) in the image


class DeferredPatch:
    """A mask's (height, width) bool pixels, decoded by ``decode()`` each time it is indexed: a file states a mask's
    size before import has matched the image's size to the photo, so nothing is allocated until then, and only one
    mask is in memory at a time."""

    def __init__(self, decode: Callable[[], np.ndarray], width: int, height: int):
        self.decode, self.shape = decode, (height, width)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        decoded = self.decode()
        return decoded if dtype is None else decoded.astype(dtype)

    def __getitem__(self, index) -> np.ndarray:
        return self.decode()[index]


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


MAX_COORDINATE = 1e15  # px or percent: far outside an image is drawn clipped, but scaled to px and gridded this overflows


def finite_points(values, where: str) -> np.ndarray:
    """(N, 2) float64 x, y from coordinates as a file holds them, flat [x1, y1, x2, y2, ...] or as pairs [[x, y], ...].

    Anything else (an odd count, text, NaN or an infinite value: JSON's NaN and Infinity, 1e400, XML's "nan", or one
    beyond :data:`MAX_COORDINATE`: 1e300) is one InputError that begins with ``where``, which names the file, the image
    and the shape.
    """
    try:
        flat = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InputError(f"{where}: coordinates that are not numbers") from None
    if len(flat) % 2:
        raise InputError(f"{where}: {len(flat)} coordinates, not x, y pairs")
    if not np.isfinite(flat).all():
        raise InputError(f"{where}: coordinates that are not finite numbers (NaN or infinite): a malformed shape")
    if flat.size and np.abs(flat).max() > MAX_COORDINATE:
        raise InputError(f"{where}: a coordinate of {np.abs(flat).max():g}, beyond the {MAX_COORDINATE:g} crackseg draws: a malformed shape")
    return flat.reshape(-1, 2)


def check_mask_box(box: tuple[int, int, int, int], size: tuple[int, int] | None, where: str) -> None:
    """Refuse, before its pixels are allocated, a mask's box (left, top, width, height in px) that is larger than its
    image (``size``: width, height as the file states them; import checks them against the photo before drawing) or
    lies wholly outside it. A box partly outside is drawn clipped, and counted."""
    left, top, width, height = box
    if size is None:
        raise InputError(f"{where}: a mask in an image whose size the file leaves out; give the image its width and height")
    if not (0 < width <= size[0] and 0 < height <= size[1] and -width < left < size[0] and -height < top < size[1]):
        raise InputError(f"{where}: a mask of {width}x{height} px at ({left}, {top}) does not fit its {size[0]}x{size[1]} px image")


def paint_all(canvas: np.ndarray, shapes: list[Shape], line_width: float | None = None) -> list[tuple[int, bool]]:
    """Draw each shape on ``canvas`` ((H, W) bool) as its tool draws it on the whole image: COCO RLEs and pycocotools'
    polygons encoded on the image and decoded once, PIL's shapes drawn on a picture of the image's size and read back
    in each one's box. Returns, per shape, (the pixels it covers in the image, whether part of it lies outside)."""
    painter = _Painter(canvas, line_width)
    painted = [painter.paint(shape) for shape in shapes]
    painter.finish()
    return painted


class _Painter:
    """The drawing of one image's shapes (see :func:`paint_all`)."""

    def __init__(self, canvas: np.ndarray, line_width: float | None):
        self.canvas, self.line_width = canvas, line_width
        self.rles: list[dict] = []  # COCO RLEs and pycocotools' polygons, each of the whole image
        self.picture: Image.Image | None = None  # PIL's drawing, made when the first PIL shape comes

    def paint(self, shape: Shape) -> tuple[int, bool]:
        height, width = self.canvas.shape
        if shape.rle is not None:
            if list(shape.rle["size"]) != [height, width]:
                raise ValueError(f"a COCO RLE of another size than its {width}x{height} image")
            return self._encoded(shape.rle), False
        if shape.kind == "mask":
            left, top = shape.origin
            rows, cols = shape.patch.shape
            inside = shape.patch[max(0, -top) : max(0, height - top), max(0, -left) : max(0, width - left)]
            window = self.canvas[max(0, top) : max(0, top) + inside.shape[0], max(0, left) : max(0, left) + inside.shape[1]]
            window |= inside
            return int(inside.sum()), left < 0 or top < 0 or left + cols > width or top + rows > height
        points = shape.points if shape.centres else shape.points - 0.5 * (shape.kind == "line")  # lines are drawn on centres
        stroke = max(1, int((shape.width or self.line_width or 1) + 0.5)) if shape.kind == "line" else 0  # PIL draws whole px
        low, high = (-0.5, np.array([width, height]) - 0.5) if shape.centres or shape.kind == "line" else (0.0, np.array([width, height]))
        clipped = bool(len(points)) and bool((points - stroke / 2 < low).any() or (points + stroke / 2 > high).any())
        if len(points) < (2 if shape.kind == "line" else 3) or not np.isfinite(points).all():
            return 0, clipped
        if shape.kind == "polygon" and not shape.centres:  # pycocotools: whole, or cut at the image's edges when too long to hold
            too_long = clipped and _coco_steps(points) > COCO_STEP_LIMIT
            piece = _clip_polygon(points, np.zeros(2), np.array([width, height], float)) if too_long else points
            if len(piece) < 3:
                return 0, clipped
            masks = require("pycocotools.mask", "labels", "drawing polygons as pycocotools does")
            return self._encoded(masks.frPyObjects([piece.ravel().tolist()], height, width)[0]), clipped
        margin = PIL_MARGIN + stroke  # PIL: cut that far out, where the cut edges cover no pixel of the image and PIL draws right
        outer_low, outer_high = np.array([-margin, -margin], float), np.array([width + margin, height + margin], float)
        if not ((points < outer_low).any() or (points > outer_high).any()):
            pieces = [points]
        elif shape.kind == "polygon":
            pieces = [_clip_polygon(points, outer_low, outer_high)]
        else:
            pieces = _clip_polyline(points, outer_low, outer_high)
        return sum(self._drawn(shape, piece, stroke) for piece in pieces), clipped

    def finish(self) -> None:
        if self.rles:
            masks = require("pycocotools.mask", "labels", "reading COCO RLE")
            self.canvas |= masks.decode(masks.merge(self.rles)).astype(bool)

    def _encoded(self, rle: dict) -> int:
        masks = require("pycocotools.mask", "labels", "reading COCO RLE")
        self.rles.append(rle)
        return int(masks.area(rle))  # one by one: pycocotools 2.0.11 fails on lists over 255

    def _drawn(self, shape: Shape, points: np.ndarray, stroke: int) -> int:
        """Draw one PIL polygon or polyline (coordinates within reach of the image) on the image's picture, and read it
        back in its box (cleared again for the next); the pixels it covers."""
        height, width = self.canvas.shape
        if len(points) < (2 if shape.kind == "line" else 3):
            return 0
        x0, y0 = np.maximum(np.floor(points.min(axis=0)).astype(int) - stroke - 1, 0)
        x1, y1 = np.minimum(np.ceil(points.max(axis=0)).astype(int) + stroke + 2, [width, height])
        if x1 <= x0 or y1 <= y0:
            return 0
        if self.picture is None:
            self.picture = Image.new("L", (width, height), 0)
        draw, xy = ImageDraw.Draw(self.picture), [tuple(point) for point in points.tolist()]
        if shape.kind == "polygon":
            draw.polygon(xy, outline=1, fill=1)  # labelme's shape_to_mask
        else:
            draw.line(xy, fill=1, width=stroke, joint=None if shape.centres else "curve")
        box = (int(x0), int(y0), int(x1), int(y1))
        drawn = np.asarray(self.picture.crop(box), dtype=bool)
        draw.rectangle((box[0], box[1], box[2] - 1, box[3] - 1), fill=0)
        self.canvas[y0:y1, x0:x1] |= drawn
        return int(drawn.sum())


def _coco_steps(points: np.ndarray) -> int:
    """How many boundary points pycocotools lists for the outline: each edge's longer side on its grid, plus one."""
    grid = np.trunc(COCO_GRID * points + 0.5)
    return int((np.abs(grid - np.roll(grid, -1, axis=0)).max(axis=1) + 1).sum())


def _clip_polygon(points: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Sutherland-Hodgman: the ring ``points`` ((N, 2) x, y; concave or self-crossing too) cut to the rectangle
    ``low``..``high``. A point inside the rectangle keeps its crossing number (a ray along a cutting edge crosses the
    same edges as before), so the fill inside is unchanged; what lay outside becomes runs along the rectangle's edges."""
    for axis in (0, 1):
        for bound, side in ((low[axis], -1.0), (high[axis], 1.0)):
            if not len(points):
                return points
            beyond = side * (points[:, axis] - bound)  # > 0: outside
            inside = beyond <= 0
            before, beyond_before = np.roll(points, 1, axis=0), np.roll(beyond, 1)
            crossing = inside != np.roll(inside, 1)
            share = np.divide(beyond_before, beyond_before - beyond, out=np.zeros_like(beyond), where=crossing)
            cut = before + share[:, None] * (points - before)
            cut[:, axis] = bound
            points = np.stack([cut, points], axis=1)[np.stack([crossing, inside], axis=1)]  # S-H: the cut, then the vertex
    return np.clip(points, low, high)


def _clip_polyline(points: np.ndarray, low: np.ndarray, high: np.ndarray) -> list[np.ndarray]:
    """Liang-Barsky: the pieces of the polyline ``points`` inside the rectangle ``low``..``high``, each a polyline."""
    start, step = points[:-1], np.diff(points, axis=0)
    enter, leave = np.zeros(len(step)), np.ones(len(step))
    for axis in (0, 1):
        for bound, side in ((low[axis], -1.0), (high[axis], 1.0)):
            rate, offset = side * step[:, axis], side * (start[:, axis] - bound)  # inside where rate * t + offset <= 0
            limit = np.divide(-offset, rate, out=np.zeros_like(rate), where=rate != 0)
            leave = np.where(rate > 0, np.minimum(leave, limit), np.where((rate == 0) & (offset > 0), -1.0, leave))
            enter = np.where(rate < 0, np.maximum(enter, limit), enter)
    pieces: list[list[np.ndarray]] = []
    for number in np.flatnonzero(enter <= leave):
        first, last = start[number] + enter[number] * step[number], start[number] + leave[number] * step[number]
        if pieces and np.array_equal(pieces[-1][-1], first):  # goes on from where the last piece ended
            pieces[-1].append(last)
        else:
            pieces.append([first, last])
    return [np.clip(np.array(piece), low, high) for piece in pieces]
