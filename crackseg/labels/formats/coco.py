"""COCO files <-> crack masks.

x, y run along pixel edges, pixel (x, y) being the square from x to x+1; a pixel belongs to a
polygon when pycocotools says so (its centre inside). Polygons and RLE (compressed or not) are
decoded by pycocotools itself. A crack traced along its two edges comes back exactly as wide as
traced, not a pixel wider on each side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError, require
from crackseg.core.version import __version__
from crackseg.labels.formats.outlines import CRACK, crack_components, edge_polygon
from crackseg.labels.formats.shapes import Annotations, LabelledImage, Shape, finite_points, load_json, stated_size


def read_coco(path: Path) -> Annotations:
    document = load_json(path)
    if not (isinstance(document, dict) and isinstance(document.get("images"), list) and isinstance(document.get("annotations"), list)):
        raise InputError(f"{path}: not a COCO file (it needs lists of images and annotations)")
    listed = document.get("categories") or []
    for kind, items in (("image", document["images"]), ("category", listed), ("annotation", document["annotations"])):
        _refuse_shared_ids(path, kind, [item["id"] for item in items if kind != "annotation" or "id" in item])  # ids are optional there
    categories = {item["id"]: str(item["name"]) for item in listed}
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
            image.shapes += [Shape(label, "polygon", finite_points(polygon, f"{where} (image {image.name}): polygon {part}"))
                             for part, polygon in enumerate(segmentation)]
        elif isinstance(segmentation, dict):
            image.shapes.append(Shape(label, "mask", rle=_read_coco_rle(segmentation, image, where)))
        elif segmentation in (None, []):  # a bounding box without an outline (Label Studio's export of a rectangle)
            image.shapes.append(Shape(label, "box"))
        else:
            raise InputError(f"{where}: its segmentation {str(segmentation)[:40]!r} is neither polygons (a list of lists) nor an RLE")
    return Annotations(list(images.values()), set(categories.values()))


def _refuse_shared_ids(path: Path, kind: str, ids: list) -> None:
    """Ids name images, categories and annotations: a shared one would move cracks to another photo, import another
    label as crack, or make annotations that readers keyed by id (pycocotools' COCO) see as one."""
    times = Counter(ids)
    shared = [key for key, count in times.items() if count > 1]
    if shared:
        others = f" (so do {', '.join(map(repr, shared[1:4]))}{', ...' if len(shared) > 4 else ''})" if len(shared) > 1 else ""
        raise InputError(f"{path}: {kind} id {shared[0]!r} appears {times[shared[0]]} times{others}; each {kind} needs an id of its own")


def _read_coco_rle(segmentation: dict, image: LabelledImage, where: str) -> dict:
    """The compressed RLE of a COCO segmentation (decoded by :func:`paint_all`, all of an image's at once)."""
    masks = require("pycocotools.mask", "labels", "reading COCO RLE")
    height, width = (int(v) for v in segmentation["size"])
    if image.size is not None and image.size != (width, height):
        raise InputError(f"{where}: its RLE is {width}x{height} px but its image {image.name} is {image.size[0]}x{image.size[1]}")
    image.size = (width, height)
    counts = segmentation["counts"]
    compressed = not isinstance(counts, list)
    if compressed:
        counts = counts.encode() if isinstance(counts, str) else counts
    if not compressed:  # pycocotools would cut 30.5 to 30
        if not all(isinstance(run, (int, float)) and not isinstance(run, bool) and float(run).is_integer() for run in counts):
            raise InputError(f"{where}: its RLE counts are not all whole numbers of pixels")
        counts = [int(run) for run in counts]
    runs = _compressed_runs(counts) if compressed else counts
    if min(runs, default=0) < 0 or sum(runs) != width * height:  # pycocotools fails on these only when it decodes them
        raise InputError(f"{where}: its RLE counts cover {sum(runs)} pixels, not {width}x{height}")
    if compressed:
        return {"size": [height, width], "counts": counts}
    return masks.frPyObjects({"size": [height, width], "counts": counts}, height, width)


def _compressed_runs(text: bytes) -> list[int]:
    """The run lengths of COCO's compressed RLE string (pycocotools' rleFrString): each number in 5-bit groups,
    lowest first, from character 48; 0x20 says another group follows and 0x10 in the last one is the sign; from the
    fourth number on, each is stored as its difference to the one two before."""
    codes = np.frombuffer(text, dtype=np.uint8).astype(np.int64) - 48
    if not len(codes):
        return []
    if ((codes < 0) | (codes > 63)).any() or codes[-1] & 0x20:
        raise ValueError("a compressed RLE string with a character out of its alphabet or cut short")
    ends = np.flatnonzero(codes & 0x20 == 0)
    starts = np.concatenate([[0], ends[:-1] + 1])
    place = np.arange(len(codes)) - np.repeat(starts, ends - starts + 1)
    if place.max() > 6:  # pycocotools' runs are 32-bit: their differences take at most 7 groups
        raise ValueError("a compressed RLE string with a number of more than 35 bits")
    values = np.add.reduceat((codes & 0x1F) << (5 * place), starts)
    values -= np.where(codes[ends] & 0x10, 1 << (5 * (place[ends] + 1)), 0)  # negative: the sign extended
    values[3::2], values[4::2] = np.cumsum(values[1::2])[1:], np.cumsum(values[2::2])[1:]
    return values.tolist()


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
