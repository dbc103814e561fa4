"""COCO files <-> crack masks.

x, y run along pixel edges, pixel (x, y) being the square from x to x+1; a pixel belongs to a
polygon when pycocotools says so (its centre inside). Polygons and RLE (compressed or not) are
decoded by pycocotools itself. A crack traced along its two edges comes back exactly as wide as
traced, not a pixel wider on each side.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError, require
from crackseg.core.version import __version__
from crackseg.labels.formats.outlines import CRACK, crack_components, edge_polygon
from crackseg.labels.formats.shapes import Annotations, LabelledImage, Shape, load_json, stated_size


def read_coco(path: Path) -> Annotations:
    document = load_json(path)
    if not (isinstance(document, dict) and isinstance(document.get("images"), list) and isinstance(document.get("annotations"), list)):
        raise InputError(f"{path}: not a COCO file (it needs lists of images and annotations)")
    categories = {item["id"]: str(item["name"]) for item in document.get("categories") or []}
    images = {item["id"]: LabelledImage(item["file_name"], stated_size(item.get("width"), item.get("height"))) for item in document["images"]}
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
        for component, (left, top) in crack_components(mask):
            outline = _coco_rle(component, (left, top), mask.shape) if rle else [edge_polygon(component, (left, top)).ravel().tolist()]
            annotations.append({"id": len(annotations) + 1, "image_id": number, "category_id": 1, "segmentation": outline,
                                "area": int(component.sum()), "bbox": [left, top, component.shape[1], component.shape[0]], "iscrowd": 0})
    return {"info": {"description": f"crackseg {__version__} predictions"}, "images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": CRACK, "supercategory": ""}]}
