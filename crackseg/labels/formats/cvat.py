"""CVAT for images 1.1 XML files <-> crack masks.

``<polygon points="x1,y1;x2,y2;...">`` in COCO's edge coordinates (CVAT's mask exports rasterize
polygons with pycocotools, through Datumaro's PolygonsToMasks); ``<mask rle="..." left top width
height>``: counts of alternating background and crack runs, background first, row by row within
the box (CVAT's dataset_manager), checked against the image's size when read and decoded only when
drawn; ``<polyline>``: a line through the points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from crackseg.core.errors import InputError
from crackseg.labels.formats.outlines import CRACK, crack_components, edge_polygon
from crackseg.labels.formats.shapes import Annotations, DeferredPatch, LabelledImage, Shape, check_mask_box, finite_points, stated_size


def read_cvat(path: Path) -> Annotations:
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        raise InputError(f"{path}: not readable XML ({error})") from None
    if root.tag != "annotations" or root.find("track") is not None:
        raise InputError(f"{path}: not a CVAT for images 1.1 file (export the task as 'CVAT for images 1.1')")
    labels = {str(name.text) for name in root.iterfind("meta//labels/label/name")}
    images = []
    for element in root.iterfind("image"):
        image = LabelledImage(element.attrib["name"], stated_size(element.get("width"), element.get("height")))
        for number, item in enumerate(element):
            label, kind = str(item.get("label")), item.tag
            labels.add(label)
            where = f"{path}: image {image.name}: shape {number} (<{kind}>, label {label!r})"
            if kind in ("polygon", "polyline"):
                points = finite_points([pair.split(",") for pair in item.attrib["points"].split(";")], where)
                width = item.findtext("attribute[@name='width']") if kind == "polyline" else None  # a polygon has its outline
                width, refused = _line_width(width, image.size, where) if width is not None else (None, None)
                image.shapes.append(Shape(label, "polygon" if kind == "polygon" else "line", points, width=width, refused=refused))
            elif kind == "mask":
                box = tuple(int(item.attrib[key]) for key in ("left", "top", "width", "height"))
                check_mask_box(box, image.size, where)  # before its runs are counted, let alone decoded
                counts = _counts(item.attrib["rle"], box[2], box[3], where)
                patch = DeferredPatch(partial(_runs_patch, counts, box[2], box[3]), box[2], box[3])  # decoded when drawn
                image.shapes.append(Shape(label, "mask", patch=patch, origin=box[:2]))
            else:
                image.shapes.append(Shape(label, kind))  # box, points, ellipse, cuboid, skeleton, tag
        images.append(image)
    return Annotations(images, labels)


def _line_width(text: str, size: tuple[int, int] | None, where: str) -> tuple[float | None, str | None]:
    """A polyline's own width in px, positive and at most the image's larger side (PIL draws lines millions of px wide
    wrong), else why not: (width, None) or (None, the reason), which refuses the line only if it is a crack's."""
    if size is None:
        return None, f"{where}: a width attribute in an image whose size the file leaves out; give the image its width and height"
    try:
        width = float(text)
    except ValueError:
        width = math.nan
    if not (math.isfinite(width) and 0 < width <= max(size)):
        return None, f"{where}: width {text!r}; a width is a positive number of px, at most the image's larger side ({max(size)})"
    return width, None


def _counts(text: str, width: int, height: int, where: str) -> np.ndarray:
    """CVAT's counts of a ``<mask>``, which must fill its box exactly."""
    counts = [int(value) for value in text.split(",")]
    if min(counts, default=0) < 0 or sum(counts) != width * height:
        raise InputError(f"{where}: its rle covers {sum(counts)} pixels, but its box is {width}x{height}")
    return np.asarray(counts, dtype=np.int64)


def _runs_patch(counts: np.ndarray, width: int, height: int) -> np.ndarray:
    """(height, width) bool from CVAT's counts: background, crack, background, ... row by row within the box."""
    return np.repeat(np.arange(len(counts)) % 2 == 1, counts).reshape(height, width)


def cvat_rle_encode(patch: np.ndarray) -> list[int]:
    flat = patch.ravel()
    bounds = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    return ([0] if flat.size and flat[0] else []) + np.diff(bounds).tolist()


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
        for component, (left, top) in crack_components(mask):
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
