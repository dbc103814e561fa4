"""labelme files <-> crack masks.

Points are pixel centres, drawn as labelme's ``shape_to_mask`` draws them with PIL: a polygon is
filled *and* outlined, so one whose points all lie on x = 3 covers column 3; ``line`` /
``linestrip`` are PIL lines; a ``mask`` is a base64 PNG whose top-left pixel is the first point.
A file's imageData (the photo itself, base64) stands in for a photo the folder lacks. A mask's
PNG is measured from its header (against its box and the image) before its pixels are decoded.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path, PureWindowsPath

import numpy as np
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.data.inputs import paths_below
from crackseg.labels.formats.outlines import CRACK, centre_outline, crack_components
from crackseg.labels.formats.shapes import Annotations, LabelledImage, Shape, finite_points, load_json, stated_size

LABELME_VERSION = "5.5.0"


def read_labelme(path: Path, skip: Path | None) -> Annotations:
    """One labelme file, or those of a folder: its other .json files (a classes.json, a tool's settings, and anything
    named .json that is not a regular file: a folder, a pipe, which would wait for a writer) are counted and passed
    over, and ``skip`` is not read."""
    folder = path.is_dir()
    if not (folder or path.is_file()):
        raise InputError(f"{path}: not a regular file; give a labelme .json file or a folder of them")
    files, root = ([file for file in paths_below(path) if file.name.endswith(".json")], path) if folder else ([path], path.parent)
    if skip is not None:
        files = [file for file in files if file.resolve() != Path(skip).resolve()]
    found = Annotations([], set())
    found.other_json = sum(not file.is_file() for file in files)
    for file in (file for file in files if file.is_file()):
        try:
            document = load_json(file)
        except InputError:
            if not folder:
                raise
            document = None  # not JSON at all: passed over like any other .json that is not labelme's
        if folder and not (isinstance(document, dict) and isinstance(document.get("shapes"), list)):
            found.other_json += 1
            continue
        if not (isinstance(document, dict) and isinstance(document.get("shapes"), list) and "imagePath" in document):
            raise InputError(f"{file}: not a labelme file (it needs shapes and imagePath)")
        if not isinstance(document["imagePath"], str) or "\0" in document["imagePath"]:
            raise InputError(f"{file}: its imagePath {document['imagePath']!r} is not a file name (text without NUL characters)")
        place = file.parent.relative_to(root).as_posix()  # imagePath is relative to the .json file
        name = os.path.normpath(os.path.join(place, PureWindowsPath(document["imagePath"]).as_posix())).replace(os.sep, "/")
        image = LabelledImage(name, stated_size(document.get("imageWidth"), document.get("imageHeight")),
                              embedded_in=file if document.get("imageData") else None)
        for number, item in enumerate(document["shapes"]):
            kind, label = item.get("shape_type") or "polygon", str(item["label"])
            if not isinstance(kind, str):
                raise InputError(f"{file}: shape {number} (label {label!r}): its shape_type {kind!r} is not a name")
            found.labels.add(label)
            where = f"{file}: shape {number} (label {label!r})"
            points = finite_points(item["points"], where)
            if kind == "mask":
                image.shapes.append(_labelme_mask(item, points, label, where, image.size))
            elif kind in ("polygon", "line", "linestrip"):
                image.shapes.append(Shape(label, "polygon" if kind == "polygon" else "line", points, centres=True))
            else:
                image.shapes.append(Shape(label, kind))
        found.images.append(image)
    if not found.images:
        others = f" ({found.other_json} other .json files, without a shapes list)" if found.other_json else ""
        raise InputError(f"{path}: holds no labelme .json files{others}")
    return found


def _labelme_mask(item: dict, points: np.ndarray, label: str, where: str, image_size: tuple[int, int] | None) -> Shape:
    """A mask shape, its PNG's size (from its header) checked against its box and the image before it is decoded."""
    if not isinstance(item.get("mask"), str) or not item["mask"]:
        raise InputError(f"{where}: a mask shape without its mask (labelme stores a base64 PNG there)")
    (left, top), (right, bottom) = points[:2].astype(int)  # as labelme reads them (truncated)
    try:
        with Image.open(io.BytesIO(base64.b64decode(item["mask"]))) as picture:
            width, height = picture.size
            if (width, height) != (right - left + 1, bottom - top + 1):
                raise InputError(f"{where}: a mask of {width}x{height} px in a box of {right - left + 1}x{bottom - top + 1} px")
            if image_size is not None and (width > image_size[0] or height > image_size[1]):
                raise InputError(f"{where}: a mask of {width}x{height} px on a {image_size[0]}x{image_size[1]} px image")
            patch = np.asarray(picture).astype(bool)
    except Image.DecompressionBombError:
        raise InputError(f"{where}: its mask PNG is over Pillow's limit of {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels "
                         "(a decompression bomb, or not labelme's)") from None
    except (ValueError, OSError):  # bad base64 (binascii.Error), not an image
        raise InputError(f"{where}: its mask is not a base64 PNG") from None
    if patch.ndim != 2:
        raise InputError(f"{where}: its mask is not a one-channel PNG ({picture.mode})")
    return Shape(label, "mask", patch=patch, origin=(int(left), int(top)))


def embedded_photo(image: LabelledImage) -> bytes:
    """The photo a labelme file holds in imageData (the image file's bytes, base64), which labelme shows when the
    photo itself is absent; read from the file again, so that photos are in memory one at a time."""
    data = load_json(image.embedded_in).get("imageData")
    try:
        return base64.b64decode(data)
    except (ValueError, TypeError):
        raise InputError(f"{image.embedded_in}: its imageData is not base64 data") from None


def labelme_document(image_path: str, mask: np.ndarray, rle: bool) -> dict:
    """A labelme file: one polygon per crack, or a ``mask`` shape (with ``rle``, or for a crack with holes)."""
    shapes = []
    for component, (left, top) in crack_components(mask):
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
