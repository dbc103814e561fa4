"""Annotation files of labelling tools <-> crack masks, each tool's coordinates read as the tool reads them.

Every reader returns :class:`Annotations` (the images as the file names them, with their
shapes); :func:`paint` draws a shape as its tool draws it; the ``*_document`` functions turn
masks into pre-annotations. Where each tool puts a pixel (a one-pixel example per format in
tests/test_labels.py pins it):

- **COCO**: x, y run along pixel edges, pixel (x, y) being the square from x to x+1; a pixel
  belongs to a polygon when pycocotools says so (its centre inside). Polygons and RLE
  (compressed or not) are decoded by pycocotools itself. A crack traced along its two edges
  comes back exactly as wide as traced, not a pixel wider on each side.
- **CVAT for images 1.1** XML: ``<polygon points="x1,y1;x2,y2;...">`` in the same edge
  coordinates (CVAT's mask exports rasterize polygons with pycocotools, through Datumaro's
  PolygonsToMasks); ``<mask rle="..." left top width height>``: counts of alternating
  background and crack runs, background first, row by row within the box (CVAT's
  dataset_manager); ``<polyline>``: a line through the points.
- **labelme**: points are pixel centres, drawn as labelme's ``shape_to_mask`` draws them with
  PIL: a polygon is filled *and* outlined, so one whose points all lie on x = 3 covers column 3;
  ``line`` / ``linestrip`` are PIL lines; a ``mask`` is a base64 PNG whose top-left pixel is
  the first point.
- **Label Studio** JSON export: polygon points in percent of the image's width and height
  (0 = left or top edge, 100 = right or bottom edge), then placed as COCO places them, as
  label-studio-converter's COCO export does; a brush is that tool's RLE of the RGBA canvas (a
  32-bit value count, a 5-bit word size, four 4-bit run-length sizes, then repeat or literal
  runs), the crack where alpha is above 0, as label-studio-converter's brush export and its
  ls_rle_to_coco_rle read it, so a brush imports as the tool's own exports give it.
  A ``<Polygon>`` or ``<Brush>`` next to a ``<Labels>`` tag gives ``labels`` results that hold
  the shape; a task's annotation is its ground truth, else its newest.

Lines are drawn ``line_width`` px wide through the points with PIL (edge coordinates moved
half a pixel onto centres). Exported polygons are Douglas-Peucker simplified by at most
EDGE_SIMPLIFY px (CENTRE_SIMPLIFY for labelme), after dropping points on straight runs: every
pixel centre lies at least 0.35 px from the boundary that marching squares trace, and
pycocotools moves a vertex by at most 0.14 px (it rounds to fifths of a pixel), so no pixel
changes sides and the polygons draw the mask back exactly (0.3 px already lost pixels).
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import parse_qs, unquote, urlparse
from xml.etree import ElementTree

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage
from scipy.spatial import cKDTree
from skimage.measure import find_contours

from crackseg import __version__
from crackseg.config import LABEL_FORMATS
from crackseg.errors import InputError, require

EDGE_SIMPLIFY = 0.2  # px: pixel centres lie >= 0.35 px from a traced boundary and pycocotools moves a vertex <= 0.14 px
CENTRE_SIMPLIFY = 0.2  # px, for labelme's outlines through boundary pixel centres (PIL draws the outline too)
CRACK = "crack"  # the label exported shapes carry
BRUSH_SIZES = (3, 4, 8, 16)  # bits of a Label Studio brush run length, as label-studio-converter writes them
LABELME_VERSION = "5.5.0"
LS_FROM, LS_TO = "label", "image"  # Label Studio tag names exported results refer to (<PolygonLabels name="label" toName="image">)
_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-")  # Label Studio prefixes uploaded files with 8 hex digits


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


_EXPECTED = {"coco": "a COCO .json file", "cvat": "a CVAT for images 1.1 .xml file", "labelstudio": "a Label Studio JSON export (.json)"}


def read_annotations(path: Path, fmt: str, skip: Path | None = None) -> Annotations:
    """The images and shapes of an annotation file (a labelme folder: every labelme .json below it but ``skip``, the
    labels.json of the dataset being written)."""
    readers = {"coco": _read_coco, "cvat": _read_cvat, "labelstudio": _read_labelstudio}
    if fmt not in LABEL_FORMATS:
        raise InputError(f"--format must be one of {', '.join(LABEL_FORMATS)}, got {fmt!r}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir() and fmt != "labelme":
        raise InputError(f"{path} is a folder; --format {fmt} expects {_EXPECTED[fmt]}")
    try:
        return _read_labelme(path, skip) if fmt == "labelme" else readers[fmt](path)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as error:
        reason = f"missing {error}" if isinstance(error, KeyError) else str(error)
        raise InputError(f"{path}: not a valid {fmt} file: {reason}") from None


def _load_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: not readable JSON ({error})") from None


def _read_coco(path: Path) -> Annotations:
    document = _load_json(path)
    if not (isinstance(document, dict) and isinstance(document.get("images"), list) and isinstance(document.get("annotations"), list)):
        raise InputError(f"{path}: not a COCO file (it needs lists of images and annotations)")
    categories = {item["id"]: str(item["name"]) for item in document.get("categories") or []}
    images = {item["id"]: LabelledImage(item["file_name"], _size(item.get("width"), item.get("height"))) for item in document["images"]}
    for number, item in enumerate(document["annotations"]):
        where = f"{path}: annotation {item.get('id', number)}"
        image = images.get(item.get("image_id"))
        if image is None:
            raise InputError(f"{where} refers to image_id {item.get('image_id')!r}, which the images list lacks")
        if item.get("category_id") not in categories:
            raise InputError(f"{where} has category_id {item.get('category_id')!r}, which the categories list lacks")
        label, segmentation = categories[item["category_id"]], item.get("segmentation")
        if isinstance(segmentation, list) and segmentation:
            # a polygon of two points covers no pixel (pycocotools 2.0.11 fails on [[x1, y1, x2, y2]], it draws no box)
            image.shapes += [Shape(label, "polygon", _pairs(polygon)) for polygon in segmentation]
        elif isinstance(segmentation, dict):
            image.shapes.append(Shape(label, "mask", rle=_read_coco_rle(segmentation, image, where)))
        else:  # a bounding box without an outline: no segmentation, or [] (Label Studio's export of a rectangle)
            image.shapes.append(Shape(label, "box"))
    return Annotations(list(images.values()), set(categories.values()))


def _pairs(flat) -> np.ndarray:
    values = np.asarray(flat, dtype=np.float64)
    if values.ndim != 1 or len(values) % 2:
        raise ValueError(f"a polygon of {len(values)} coordinates (x, y pairs expected)")
    return values.reshape(-1, 2)


def _size(width, height) -> tuple[int, int] | None:
    return (int(width), int(height)) if width is not None and height is not None else None


def _read_coco_rle(segmentation: dict, image: LabelledImage, where: str) -> dict:
    """The compressed RLE of a COCO segmentation (decoded by :func:`paint_all`, all of an image's at once)."""
    masks = require("pycocotools.mask", "labels", "reading COCO RLE")
    height, width = (int(v) for v in segmentation["size"])
    if image.size is not None and image.size != (width, height):
        raise InputError(f"{where}: its RLE is {width}x{height} px but its image {image.name} is {image.size[0]}x{image.size[1]}")
    image.size = (width, height)
    counts = segmentation["counts"]
    if isinstance(counts, list):  # uncompressed
        if sum(counts) != width * height:
            raise InputError(f"{where}: its RLE counts cover {sum(counts)} pixels, not {width}x{height}")
        rle = masks.frPyObjects({"size": [height, width], "counts": counts}, height, width)
    else:
        rle = {"size": [height, width], "counts": counts.encode() if isinstance(counts, str) else counts}
    masks.area(rle)  # a malformed string fails here, naming the file, not later
    return rle


def _read_labelme(path: Path, skip: Path | None) -> Annotations:
    """One labelme file, or those of a folder: its other .json files (a classes.json, a tool's settings) are counted
    and passed over, and ``skip`` is not read."""
    folder = path.is_dir()
    files, root = (sorted(path.rglob("*.json")), path) if folder else ([path], path.parent)
    if skip is not None:
        files = [file for file in files if file.resolve() != Path(skip).resolve()]
    found = Annotations([], set())
    for file in files:
        try:
            document = _load_json(file)
        except InputError:
            if not folder:
                raise
            document = None  # not JSON at all: passed over like any other .json that is not labelme's
        if folder and not (isinstance(document, dict) and isinstance(document.get("shapes"), list)):
            found.other_json += 1
            continue
        if not (isinstance(document, dict) and isinstance(document.get("shapes"), list) and "imagePath" in document):
            raise InputError(f"{file}: not a labelme file (it needs shapes and imagePath)")
        place = file.parent.relative_to(root).as_posix()  # imagePath is relative to the .json file
        name = os.path.normpath(os.path.join(place, PureWindowsPath(document["imagePath"]).as_posix())).replace(os.sep, "/")
        image = LabelledImage(name, _size(document.get("imageWidth"), document.get("imageHeight")),
                              embedded_in=file if document.get("imageData") else None)
        for number, item in enumerate(document["shapes"]):
            kind, label = item.get("shape_type") or "polygon", str(item["label"])
            found.labels.add(label)
            points = np.asarray(item["points"], dtype=np.float64).reshape(-1, 2)
            if kind == "mask":
                image.shapes.append(_labelme_mask(item, points, label, f"{file}: shape {number} (label {label!r})"))
            elif kind in ("polygon", "line", "linestrip"):
                image.shapes.append(Shape(label, "polygon" if kind == "polygon" else "line", points, centres=True))
            else:
                image.shapes.append(Shape(label, kind))
        found.images.append(image)
    if not found.images:
        others = f" ({found.other_json} other .json files, without a shapes list)" if found.other_json else ""
        raise InputError(f"{path}: holds no labelme .json files{others}")
    return found


def _labelme_mask(item: dict, points: np.ndarray, label: str, where: str) -> Shape:
    if not isinstance(item.get("mask"), str) or not item["mask"]:
        raise InputError(f"{where}: a mask shape without its mask (labelme stores a base64 PNG there)")
    try:
        with Image.open(io.BytesIO(base64.b64decode(item["mask"]))) as picture:
            patch = np.asarray(picture).astype(bool)
    except (ValueError, OSError):  # bad base64 (binascii.Error), not an image
        raise InputError(f"{where}: its mask is not a base64 PNG") from None
    (left, top), (right, bottom) = points[:2].astype(int)  # as labelme reads them (truncated)
    if patch.ndim != 2 or patch.shape != (bottom - top + 1, right - left + 1):
        raise InputError(f"{where}: a mask of {patch.shape[-1]}x{patch.shape[0]} px in a box of {right - left + 1}x{bottom - top + 1} px")
    return Shape(label, "mask", patch=patch, origin=(int(left), int(top)))


def embedded_photo(image: LabelledImage) -> bytes:
    """The photo a labelme file holds in imageData (the image file's bytes, base64), which labelme shows when the
    photo itself is absent; read from the file again, so that photos are in memory one at a time."""
    data = _load_json(image.embedded_in).get("imageData")
    try:
        return base64.b64decode(data)
    except (ValueError, TypeError):
        raise InputError(f"{image.embedded_in}: its imageData is not base64 data") from None


def _read_cvat(path: Path) -> Annotations:
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        raise InputError(f"{path}: not readable XML ({error})") from None
    if root.tag != "annotations" or root.find("track") is not None:
        raise InputError(f"{path}: not a CVAT for images 1.1 file (export the task as 'CVAT for images 1.1')")
    labels = {str(name.text) for name in root.iterfind("meta//labels/label/name")}
    images = []
    for element in root.iterfind("image"):
        image = LabelledImage(element.attrib["name"], _size(element.get("width"), element.get("height")))
        for item in element:
            label, kind = str(item.get("label")), item.tag
            labels.add(label)
            if kind in ("polygon", "polyline"):
                points = np.asarray([pair.split(",") for pair in item.attrib["points"].split(";")], dtype=np.float64)
                width = item.findtext("attribute[@name='width']")
                image.shapes.append(Shape(label, "polygon" if kind == "polygon" else "line", points,
                                          width=_line_width(width, path) if width is not None else None))
            elif kind == "mask":
                box = [int(item.attrib[key]) for key in ("left", "top", "width", "height")]
                patch = cvat_rle_decode(item.attrib["rle"], box[2], box[3], path)
                image.shapes.append(Shape(label, "mask", patch=patch, origin=(box[0], box[1])))
            else:
                image.shapes.append(Shape(label, kind))  # box, points, ellipse, cuboid, skeleton, tag
        images.append(image)
    return Annotations(images, labels)


def _line_width(text: str, path: Path) -> float:
    width = float(text)
    if not (math.isfinite(width) and width > 0):
        raise InputError(f"{path}: a polyline with width {text!r}; a width is a positive number of px")
    return width


def cvat_rle_decode(text: str, width: int, height: int, path: Path) -> np.ndarray:
    """(height, width) bool from CVAT's counts: background, crack, background, ... row by row within the box."""
    counts = [int(value) for value in text.split(",")]
    if min(counts, default=0) < 0 or sum(counts) != width * height:
        raise InputError(f"{path}: a mask whose rle covers {sum(counts)} pixels, but its box is {width}x{height}")
    return np.repeat(np.arange(len(counts)) % 2 == 1, counts).reshape(height, width)


def cvat_rle_encode(patch: np.ndarray) -> list[int]:
    flat = patch.ravel()
    bounds = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    return ([0] if flat.size and flat[0] else []) + np.diff(bounds).tolist()


def _read_labelstudio(path: Path) -> Annotations:
    document = _load_json(path)
    tasks = [document] if isinstance(document, dict) else document
    if not (isinstance(tasks, list) and all(isinstance(task, dict) and isinstance(task.get("data"), dict) for task in tasks)):
        raise InputError(f"{path}: not a Label Studio JSON export (a list of tasks with data; JSON-MIN and CSV exports hold no shapes)")
    found = Annotations([], set())
    for task in tasks:
        listed = task.get("annotations") or task.get("completions") or []  # "completions" before Label Studio 1.0
        done = [item for item in listed if not (item.get("was_cancelled") or item.get("skipped"))]
        found.cancelled += len(listed) - len(done)
        if not done:
            found.unlabelled += 1
            continue
        found.several += len(done) > 1
        image = LabelledImage(_task_image(task, path), None)
        _read_results(_chosen_annotation(done).get("result") or [], image, found.labels, path)
        found.images.append(image)
    return found


def _chosen_annotation(annotations: list[dict]) -> dict:
    """The annotation of a task to import: the one marked ground truth, else the newest (updated_at, else
    created_at), else the last listed."""
    marked = [item for item in annotations if item.get("ground_truth")] or annotations
    times = [_timestamp(item.get("updated_at")) or _timestamp(item.get("created_at")) for item in marked]
    if None in times:
        return marked[-1]
    return marked[max(range(len(marked)), key=lambda number: (times[number], number))]


def _timestamp(text) -> datetime | None:
    """An ISO 8601 time (a trailing Z is UTC; one without a zone is taken as UTC), seconds since 1970, or None."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return datetime.fromtimestamp(text, timezone.utc)
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", text.strip()))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _read_results(results: list[dict], image: LabelledImage, labels: set[str], path: Path) -> None:
    """An annotation's results as ``image``'s shapes, region by region: all results of a region share its id, so a
    ``<Polygon>`` or ``<Brush>`` beside a ``<Labels>`` tag gives one shape (from the result that holds points or an
    RLE) with the labels of its ``labels`` result. A shape without labels is labelled by its type (polygon, brush)."""
    regions: dict[tuple, list[dict]] = {}
    for number, result in enumerate(results):
        regions.setdefault(("id", result["id"]) if result.get("id") is not None else ("result", number), []).append(result)
    for region in regions.values():
        outlined = [result for result in region if _outline(result) != (None, None)]
        labelling = [result for result in region if str(result.get("type", "")).endswith("labels")] if outlined else []
        shape_results = {id(result) for result in outlined + labelling}
        for result in region:  # rectangles, points, choices, texts: counted under their values, not drawn
            if id(result) not in shape_results:
                kind = str(result.get("type", ""))
                names = _names(result) or [kind]
                labels.update(names)
                image.shapes += [Shape(name, kind) for name in names]
        if not outlined:
            continue
        points, rle = _outline(outlined[0])
        names = list(dict.fromkeys(name for result in labelling for name in _names(result))) or ["polygon" if points is not None else "brush"]
        labels.update(names)
        size = (int(outlined[0]["original_width"]), int(outlined[0]["original_height"]))
        if image.size not in (None, size):
            raise InputError(f"{path}: results of {image.name} give two image sizes, {image.size} and {size}")
        image.size = size
        if points is not None:  # percent -> px, rounded off the float error of the percentages
            shape = Shape("", "polygon", np.round(np.asarray(points, dtype=np.float64).reshape(-1, 2) * np.asarray(size) / 100.0, 6))
        else:
            shape = Shape("", "mask", patch=brush_decode(rle, *size, path))
        image.shapes += [replace(shape, label=name) for name in names]


def _names(result: dict) -> list[str]:
    """The values a result gives under its type: labels, choices."""
    value = result.get("value") or {}
    found = value.get(str(result.get("type", "")))
    return [str(name) for name in found] if isinstance(found, list) else []


def _outline(result: dict) -> tuple[list | None, list | None]:
    """A result's (polygon points in percent, brush RLE); (None, None) for shapes without an outline."""
    value = result.get("value") or {}
    if value.get("points") is not None:
        return value["points"], None
    return None, value.get("rle") or result.get("rle")


def _task_image(task: dict, path: Path) -> str:
    """The image's name from a task's data: its path, the ``d`` of a local-files URL, or an upload's name."""
    data = task["data"]
    texts = [value for value in data.values() if isinstance(value, str)]
    url = data.get("image") if isinstance(data.get("image"), str) else texts[0] if len(texts) == 1 else None
    if url is None:
        raise InputError(f"{path}: task {task.get('id')}: cannot tell which of its data ({', '.join(data)}) is the image")
    parsed = urlparse(url)
    local = parse_qs(parsed.query).get("d")
    return unquote(local[0] if local else parsed.path if parsed.scheme or parsed.netloc else url)


def upload_names(name: str) -> list[str]:
    """Names an image may have had before Label Studio stored it: as given, then without its upload prefix."""
    base = PurePosixPath(name).name
    return [name] + ([_UPLOAD_PREFIX.sub("", base)] if _UPLOAD_PREFIX.match(base) else [])


def stored_upload_name(file_name: str) -> str:
    """The name Label Studio stores an uploaded file under, after its prefix: Django's storage cleans it
    (get_valid_filename: stripped, spaces to underscores, characters other than letters, digits, - _ . dropped),
    so ``my photo (1).png`` becomes ``my_photo_1.png``."""
    return re.sub(r"[^-\w.]", "", file_name.strip().replace(" ", "_"))


class _Bits:
    def __init__(self, data: list[int]):
        self.bits, self.at = np.unpackbits(np.asarray(data, dtype=np.uint8)), 0  # one byte a bit

    def read(self, count: int, size: int = 1) -> np.ndarray:
        """``size`` values of ``count`` bits each, most significant bit first."""
        end = self.at + count * size
        if end > len(self.bits):
            raise ValueError("the brush RLE ends early")
        values = self.bits[self.at : end].reshape(size, count) @ (1 << np.arange(count - 1, -1, -1, dtype=np.int64))
        self.at = end
        return values

    def one(self, count: int) -> int:
        return int(self.read(count)[0])


def brush_decode(rle: list[int], width: int, height: int, path: Path) -> np.ndarray:
    """(height, width) bool from a Label Studio brush of RGBA values: crack where alpha > 0, as label-studio-converter
    reads brushes. Only the alpha values are kept (value 4k + 3 is pixel k's), never the whole canvas."""
    bits = _Bits(rle)
    count, word = bits.one(32), bits.one(5) + 1
    sizes = [bits.one(4) + 1 for _ in range(4)]
    if count != width * height * 4:
        raise InputError(f"{path}: a brush of {count} values on a {width}x{height} image ({width * height * 4} expected)")
    crack, at = np.zeros(width * height, bool), 0
    while at < count:
        repeat = bits.one(1)
        stop = min(at + 1 + bits.one(sizes[bits.one(2)]), count)
        if repeat:
            crack[at // 4 : stop // 4] = bits.one(word) > 0
        else:  # literal values at..stop-1: the alpha ones from the first index that is 3 mod 4
            crack[at // 4 : stop // 4] = bits.read(word, stop - at)[(3 - at) % 4 :: 4] > 0
        at = stop
    return crack.reshape(height, width)


def brush_encode(mask: np.ndarray) -> list[int]:
    """A Label Studio brush of ``mask`` (crack = 255 in all four RGBA values), in runs."""
    flat = mask.ravel()
    starts = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1])
    lengths = np.diff(np.concatenate([starts, [flat.size]])) * 4
    text = [f"{flat.size * 4:032b}", f"{8 - 1:05b}", *(f"{size - 1:04b}" for size in BRUSH_SIZES)]
    for length, value in zip(lengths.tolist(), np.where(flat[starts], 255, 0).tolist()):
        while length > 0:
            run = min(length, 1 << BRUSH_SIZES[-1])
            index = next(i for i, size in enumerate(BRUSH_SIZES) if run - 1 < 1 << size)
            text.append(f"1{index:02b}{run - 1:0{BRUSH_SIZES[index]}b}{value:08b}")
            length -= run
    bits = "".join(text)
    bits += "0" * (-len(bits) % 8)
    return np.packbits(np.frombuffer(bits.encode(), np.uint8) - ord("0")).tolist()


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


# Masks -> shapes (export)


def _components(mask: np.ndarray):
    """Each 8-connected crack as ((h, w) bool pixels of its box, (left, top))."""
    labels, _ = ndimage.label(mask, np.ones((3, 3), bool))
    for number, box in enumerate(ndimage.find_objects(labels), 1):
        yield labels[box] == number, (box[1].start, box[0].start)


def _area(ring: np.ndarray) -> float:
    x, y = ring[:, 0], ring[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _corners(ring: np.ndarray) -> np.ndarray:
    """A closed ring without the points that lie on a straight run (exact: the coordinates are halves), closed."""
    steps = np.diff(ring, axis=0)
    before = np.roll(steps, 1, axis=0)
    turns = (steps[:, 0] * before[:, 1] != steps[:, 1] * before[:, 0]) | ((steps * before).sum(axis=1) <= 0)
    corners = ring[:-1][turns]
    return np.concatenate([corners, corners[:1]])


def _simplify(ring: np.ndarray, tolerance: float) -> np.ndarray:
    """Douglas-Peucker on a closed ring (first point repeated last): every dropped point lies within ``tolerance`` of
    the segment that replaces it. All segments of a level are split at once."""
    keep = np.zeros(len(ring), bool)
    keep[[0, -1, int(np.argmax(((ring - ring[0]) ** 2).sum(axis=1)))]] = True
    while True:
        ends = np.flatnonzero(keep)
        part = np.minimum(np.searchsorted(ends, np.arange(len(ring)), side="right") - 1, len(ends) - 2)
        start, step = ring[ends[part]], ring[ends[part + 1]] - ring[ends[part]]
        length = (step**2).sum(axis=1)
        along = np.clip(((ring - start) * step).sum(axis=1) / np.where(length > 0, length, 1), 0, 1)
        gap = np.hypot(*(ring - start - along[:, None] * step).T)
        gap[keep] = 0
        split = np.maximum.reduceat(gap, ends[:-1]) > tolerance
        if not split.any():
            return ring[keep]
        order = np.lexsort((-gap, part))  # by segment, farthest first
        keep[order[np.searchsorted(part[order], np.flatnonzero(split))]] = True


def _contours(component: np.ndarray) -> list[np.ndarray]:
    """Closed boundaries of one component, (N, 2) x, y in its padded box's centre coordinates, the outer one first."""
    found = find_contours(np.pad(component, 1).astype(np.uint8), 0.5, fully_connected="high")
    return sorted((contour[:, ::-1] for contour in found), key=lambda ring: -abs(_area(ring)))


def edge_polygon(component: np.ndarray, origin: tuple[int, int]) -> np.ndarray:
    """One polygon in edge coordinates ((N, 2) x, y) that pycocotools draws as ``component``: its outer boundary with
    each hole joined to it by a cut of zero width (a keyhole), which covers no pixel."""
    rings = [_simplify(_corners(ring), EDGE_SIMPLIFY)[:-1] + np.asarray(origin) - 0.5 for ring in _contours(component)]
    return rings[0] if len(rings) == 1 else _join_holes(rings)


def _join_holes(rings: list[np.ndarray]) -> np.ndarray:
    """The outer ring (first) with every hole spliced in: the cuts form the shortest tree (Kruskal) over each
    hole's nearest vertex on another ring, so they cross the crack, not the background between holes."""
    starts = np.cumsum([0] + [len(ring) for ring in rings])
    owner = np.repeat(np.arange(len(rings)), np.diff(starts))
    every, outer = cKDTree(np.concatenate(rings)), cKDTree(rings[0])
    cuts = []  # (length, ring, its vertex, other ring, its vertex)
    for number in range(1, len(rings)):
        lengths, found = every.query(rings[number], k=min(32, len(owner)))
        lengths = np.where(owner[found] != number, lengths, np.inf)
        at = np.unravel_index(lengths.argmin(), lengths.shape)
        if np.isfinite(lengths[at]):
            other = int(owner[found[at]])
            cuts.append((lengths[at], number, int(at[0]), other, int(found[at] - starts[other])))
        lengths, found = outer.query(rings[number])  # a cut to the outer ring always exists
        cuts.append((lengths.min(), number, int(lengths.argmin()), 0, int(found[lengths.argmin()])))
    group = list(range(len(rings)))

    def root(ring: int) -> int:
        while group[ring] != ring:
            group[ring] = group[group[ring]]
            ring = group[ring]
        return ring

    links: dict[int, list[tuple[int, int, int]]] = {}  # ring -> (its vertex, other ring, that ring's vertex)
    for _, ring, vertex, other, other_vertex in sorted(cuts):
        if root(ring) != root(other):
            group[root(ring)] = root(other)
            links.setdefault(ring, []).append((vertex, other, other_vertex))
            links.setdefault(other, []).append((other_vertex, ring, vertex))
    pieces, stack, seen = [], [(0, 0)], {0}  # each ring from the vertex its cut arrives at, round to it again
    while stack:
        item = stack.pop()
        if isinstance(item, np.ndarray):
            pieces.append(item)
            continue
        ring, entry = item
        order = np.roll(rings[ring], -entry, axis=0)
        hung = sorted(((here - entry) % len(order), other, there) for here, other, there in links.get(ring, []) if other not in seen)
        seen.update(other for _, other, _ in hung)
        todo, done = [], 0
        for offset, other, there in hung:  # up to the cut's vertex, round the hole, back at that vertex
            todo += [order[done : offset + 1], (other, there), order[offset : offset + 1]]
            done = offset + 1
        stack += reversed(todo + [np.concatenate([order[done:], order[:1]])])
    return np.concatenate(pieces)


def centre_outline(component: np.ndarray, origin: tuple[int, int]) -> np.ndarray | None:
    """The outline through ``component``'s boundary pixel centres ((N, 2) x, y) that labelme draws back as it, or
    None when the component has holes (PIL would fill them)."""
    if ndimage.binary_fill_holes(component).sum() != component.sum():
        return None
    padded = np.pad(component, 1)
    ring = _contours(component)[0][:, ::-1]  # (row, col): each point halfway between a crack pixel and a background one
    low, high = np.floor(ring).astype(int), np.ceil(ring).astype(int)
    inside = padded[low[:, 0], low[:, 1]][:, None]
    points = np.where(inside, low, high)[:, ::-1] + np.asarray(origin) - 1
    points = points[np.concatenate([[True], (points[1:] != points[:-1]).any(axis=1)])].astype(np.float64)
    if len(points) > 1 and (points[0] == points[-1]).all():
        points = points[:-1]
    if len(points) > 3:
        points = _simplify(_corners(np.concatenate([points, points[:1]])), CENTRE_SIMPLIFY)[:-1]
    return np.concatenate([points] * 3)[:3] if len(points) < 3 else points


def _coco_rle(component: np.ndarray, origin: tuple[int, int], shape: tuple[int, int]) -> dict:
    """The compressed COCO RLE of one component in the whole image, from its pixels alone (column by column)."""
    masks = require("pycocotools.mask", "labels", "writing COCO RLE")
    height, width = shape
    rows, cols = np.nonzero(component.T)[::-1]
    index = np.sort((cols + origin[0]) * height + rows + origin[1])
    starts = index[np.concatenate([[True], np.diff(index) > 1])]
    ends = index[np.concatenate([np.diff(index) > 1, [True]])] + 1
    bounds = np.stack([starts, ends], axis=1).ravel()
    counts = np.diff(np.concatenate([[0], bounds, [height * width]])).tolist()
    rle = masks.frPyObjects({"size": [height, width], "counts": counts}, height, width)
    return {"size": [height, width], "counts": rle["counts"].decode()}


def coco_document(items: Iterable[tuple[str, np.ndarray]], rle: bool) -> dict:
    """A COCO file: one annotation per crack (8-connected), its outline as one polygon or its RLE."""
    images, annotations = [], []
    for number, (name, mask) in enumerate(items, 1):
        images.append({"id": number, "file_name": name, "width": mask.shape[1], "height": mask.shape[0]})
        for component, (left, top) in _components(mask):
            outline = _coco_rle(component, (left, top), mask.shape) if rle else [edge_polygon(component, (left, top)).ravel().tolist()]
            annotations.append({"id": len(annotations) + 1, "image_id": number, "category_id": 1, "segmentation": outline,
                                "area": int(component.sum()), "bbox": [left, top, component.shape[1], component.shape[0]], "iscrowd": 0})
    return {"info": {"description": f"crackseg {__version__} predictions"}, "images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": CRACK, "supercategory": ""}]}


def labelme_document(image_path: str, mask: np.ndarray, rle: bool) -> dict:
    """A labelme file: one polygon per crack, or a ``mask`` shape (with ``rle``, or for a crack with holes)."""
    shapes = []
    for component, (left, top) in _components(mask):
        outline = None if rle else centre_outline(component, (left, top))
        base = {"label": CRACK, "group_id": None, "description": "", "flags": {}}
        if outline is not None:
            shapes.append(base | {"points": outline.tolist(), "shape_type": "polygon", "mask": None})
            continue
        picture = io.BytesIO()
        Image.fromarray(component.astype(np.uint8)).save(picture, "PNG")  # 0/1, as labelme saves masks
        corner = [[float(left), float(top)], [float(left + component.shape[1] - 1), float(top + component.shape[0] - 1)]]
        shapes.append(base | {"points": corner, "shape_type": "mask", "mask": base64.b64encode(picture.getvalue()).decode()})
    return {"version": LABELME_VERSION, "flags": {}, "shapes": shapes, "imagePath": image_path, "imageData": None,
            "imageHeight": mask.shape[0], "imageWidth": mask.shape[1]}


def cvat_document(items: Iterable[tuple[str, np.ndarray]], rle: bool) -> bytes:
    """A CVAT for images 1.1 file: one polygon (keyhole for holes) or ``<mask>`` per crack."""
    root = ElementTree.Element("annotations")
    ElementTree.SubElement(root, "version").text = "1.1"
    task = ElementTree.SubElement(ElementTree.SubElement(root, "meta"), "task")
    for key, text in (("name", "crackseg pre-annotations"), ("size", "0"), ("mode", "annotation")):
        ElementTree.SubElement(task, key).text = text
    label = ElementTree.SubElement(ElementTree.SubElement(task, "labels"), "label")
    ElementTree.SubElement(label, "name").text = CRACK
    ElementTree.SubElement(label, "type").text = "any"
    for number, (name, mask) in enumerate(items):
        image = ElementTree.SubElement(root, "image", id=str(number), name=name, width=str(mask.shape[1]), height=str(mask.shape[0]))
        for component, (left, top) in _components(mask):
            common = {"label": CRACK, "source": "auto", "occluded": "0", "z_order": "0"}
            if rle:
                box = {"left": str(left), "top": str(top), "width": str(component.shape[1]), "height": str(component.shape[0])}
                ElementTree.SubElement(image, "mask", common | {"rle": ", ".join(map(str, cvat_rle_encode(component)))} | box)
            else:
                points = ";".join(f"{x:.2f},{y:.2f}" for x, y in edge_polygon(component, (left, top)).tolist())
                ElementTree.SubElement(image, "polygon", common | {"points": points})
    task.find("size").text = str(len(root.findall("image")))
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


def labelstudio_document(items: Iterable[tuple[str, np.ndarray]], rle: bool) -> list[dict]:
    """Label Studio tasks with the masks as predictions (pre-annotations): a polygon per crack, or one brush per image."""
    tasks = []
    for name, mask in items:
        height, width = mask.shape
        common = {"from_name": LS_FROM, "to_name": LS_TO, "original_width": width, "original_height": height, "image_rotation": 0}
        if rle:
            values = [{"format": "rle", "rle": brush_encode(mask), "brushlabels": [CRACK]}] if mask.any() else []
        else:
            values = [{"points": (edge_polygon(component, origin) * [100.0 / width, 100.0 / height]).tolist(),
                       "polygonlabels": [CRACK], "closed": True} for component, origin in _components(mask)]
        kind = "brushlabels" if rle else "polygonlabels"
        results = [common | {"id": f"crack{number}", "type": kind, "value": value} for number, value in enumerate(values, 1)]
        tasks.append({"data": {LS_TO: name}, "predictions": [{"model_version": f"crackseg {__version__}", "result": results}]})
    return tasks
