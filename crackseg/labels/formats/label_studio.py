"""Label Studio JSON exports <-> crack masks.

Polygon points are in percent of the image's width and height (0 = left or top edge, 100 = right
or bottom edge), then placed as COCO places them, as label-studio-converter's COCO export does; a
brush is that tool's RLE of the RGBA canvas (a 32-bit value count, a 5-bit word size, four 4-bit
run-length sizes, then repeat or literal runs), the crack where alpha is above 0, as
label-studio-converter's brush export and its ls_rle_to_coco_rle read it, so a brush imports as
the tool's own exports give it. A ``<Polygon>`` or ``<Brush>`` next to a ``<Labels>`` tag gives
``labels`` results that hold the shape; a task's annotation is its ground truth, else its newest.

A brush is walked through when read (a malformed one is refused before anything is written) but
decoded only when drawn, after import has checked the size it states against the photo: a small
file stating a huge canvas costs no memory. A local-files URL (``/data/local-files/?d=PATH``)
carries its path URL-encoded, as Label Studio writes it, so any file name survives the trip; a cloud storage's URL
(``s3://bucket/KEY``, ``gs://``, ``azure-blob://``) carries its key as written, as Label Studio reads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, quote, unquote, urlparse

import numpy as np

from crackseg.core.errors import InputError
from crackseg.core.version import __version__
from crackseg.labels.formats.outlines import CRACK, crack_components, edge_polygon
from crackseg.labels.formats.shapes import Annotations, LabelledImage, Shape, finite_points, load_json

BRUSH_SIZES = (3, 4, 8, 16)  # bits of a Label Studio brush run length, as label-studio-converter writes them
LS_FROM, LS_TO = "label", "image"  # Label Studio tag names exported results refer to (<PolygonLabels name="label" toName="image">)
_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-")  # Label Studio prefixes uploaded files with 8 hex digits
_CLOUD_SCHEMES = ("s3", "gs", "azure-blob")  # storages whose URLs Label Studio reads the key of as written, unescaped


def read_labelstudio(path: Path) -> Annotations:
    if not Path(path).is_file():  # a pipe would wait for a writer forever
        raise InputError(f"{path}: not a regular file; give the .json file Label Studio exported")
    document = load_json(path)
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
        for name, results in _results_by_image(task, _chosen_annotation(done).get("result") or [], path):
            image = LabelledImage(name, None)
            _read_results(results, image, found.labels, path, f"{path}: task {task.get('id')}")
            found.images.append(image)
    return found


def _results_by_image(task: dict, results: list, path: Path) -> list[tuple[str, list[dict]]]:
    """(image name, its results) for each image of the task the results are drawn on: the data value their
    ``to_name`` names (a config with several <Image> tags, a before and an after photo), else the task's image.
    Relations (``<Relations>``: one region linked to another) are left out: they hold no shape."""
    if not all(isinstance(result, dict) for result in results):
        raise InputError(f"{path}: task {task.get('id')}: results that are not objects; give the .json file Label Studio exported")
    data = task["data"]
    results = [result for result in results if result.get("type") != "relation"]  # a link between two regions, on no image
    targets = list(dict.fromkeys(result.get("to_name") for result in results)) or [None]
    unknown = [target for target in targets if not (isinstance(target, str) and isinstance(data.get(target), str))]
    if len(targets) > 1 and unknown:
        raise InputError(f"{path}: task {task.get('id')}: results on several images ({', '.join(map(str, targets))}), and its data "
                         f"({', '.join(data)}) has no image {unknown[0]!r}; crackseg cannot tell which photo each is drawn on")
    return [(_task_image(task, path) if target in unknown else _image_name(data[target]),
             [result for result in results if result.get("to_name") == target]) for target in targets]


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


def _read_results(results: list[dict], image: LabelledImage, labels: set[str], path: Path, where: str) -> None:
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
            percent = finite_points(points, f"{where}: result {outlined[0].get('id')}")
            shape = Shape("", "polygon", np.round(percent * np.asarray(size) / 100.0, 6))
        else:
            shape = Shape("", "mask", patch=_Brush(np.asarray(rle, dtype=np.uint8), *size, path))
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
    """The name of a task's one image: its data's ``image``, else its only text."""
    data = task["data"]
    texts = [value for value in data.values() if isinstance(value, str)]
    url = data.get("image") if isinstance(data.get("image"), str) else texts[0] if len(texts) == 1 else None
    if url is None:
        raise InputError(f"{path}: task {task.get('id')}: cannot tell which of its data ({', '.join(data)}) is the image")
    return _image_name(url)


def _image_name(url: str) -> str:
    """An image's name from a task's data value: its path, the ``d`` of a local-files URL, or an upload's name."""
    if not _is_url(url):
        return url  # a plain file name, as written: nothing in it is an escape
    if _in_cloud(url):
        return "/" + url.split("://", 1)[1].partition("/")[2]  # the key after the bucket, ? and # included
    parsed = urlparse(url)
    local = parse_qs(parsed.query).get("d") if "local-files" in parsed.path else None  # decoded once, as Label Studio reads it
    return local[0] if local else unquote(parsed.path)


def _is_url(text: str) -> bool:
    """Whether a task's image is a URL (a scheme, or a path on Label Studio's server such as ``/data/upload/...``),
    whose name is percent-encoded, rather than a plain file name."""
    return text.startswith("/") or bool(urlparse(text).scheme and urlparse(text).netloc)


def _in_cloud(url: str) -> bool:
    """Whether ``url`` names an object of a cloud storage (``s3://bucket/key``), whose key follows the bucket unescaped."""
    scheme, separator, _ = url.partition("://")
    return bool(separator) and scheme.lower() in _CLOUD_SCHEMES


def task_image(prefix: str, name: str) -> str:
    """A task's image for ``name`` after ``prefix``: in a URL prefix (Label Studio's ``/data/local-files/?d=``, any
    ``/...`` or ``http(s)://...``) the name is URL-encoded as Label Studio's storages write it (``quote``: ``&``, ``%``,
    ``#``, ``?``, spaces and non-ASCII escaped, ``/`` kept), and so is the folder a ``?d=`` prefix names after it, so
    reading it back gives the path; after no prefix, a plain folder or a cloud storage's (``s3://bucket/photos/``,
    ``gs://``, ``azure-blob://``, whose keys Label Studio reads as written), the name as it is."""
    if not _is_url(prefix) or _in_cloud(prefix):
        return prefix + name
    head, local, folder = prefix.partition("?d=")
    return head + local + quote(folder + name) if local else prefix + quote(name)


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
    def __init__(self, data):
        self.bits, self.at = np.unpackbits(np.asarray(data, dtype=np.uint8)), 0  # one byte a bit

    def read(self, count: int, size: int = 1) -> np.ndarray:
        """``size`` values of ``count`` bits each, most significant bit first."""
        start = self.at
        return self.bits[start : self.skip(count * size)].reshape(size, count) @ (1 << np.arange(count - 1, -1, -1, dtype=np.int64))

    def skip(self, count: int) -> int:
        """Pass over ``count`` bits; returns where they end."""
        if self.at + count > len(self.bits):
            raise ValueError("the brush RLE ends early")
        self.at += count
        return self.at

    def one(self, count: int) -> int:
        return int(self.read(count)[0])


def _brush_runs(rle, width: int, height: int, path: Path, values: bool = True):
    """A brush's runs as (start, stop, repeated value or None, literal values or None) over its ``count`` RGBA values,
    which must be the ``width`` x ``height`` x 4 its result states; ``values=False`` passes over the literal values."""
    bits = _Bits(rle)
    count, word = bits.one(32), bits.one(5) + 1
    sizes = [bits.one(4) + 1 for _ in range(4)]
    if count != width * height * 4:
        raise InputError(f"{path}: a brush of {count} values on a {width}x{height} image ({width * height * 4} expected)")
    at = 0
    while at < count:
        repeat = bits.one(1)
        stop = min(at + 1 + bits.one(sizes[bits.one(2)]), count)
        if repeat:
            yield at, stop, bits.one(word), None
        elif values:
            yield at, stop, None, bits.read(word, stop - at)
        else:
            bits.skip(word * (stop - at))
        at = stop


def brush_decode(rle: list[int], width: int, height: int, path: Path) -> np.ndarray:
    """(height, width) bool from a Label Studio brush of RGBA values: crack where alpha > 0, as label-studio-converter
    reads brushes. Only the alpha values are kept (value 4k + 3 is pixel k's), never the whole canvas."""
    crack = np.zeros(width * height, bool)
    for at, stop, repeated, literal in _brush_runs(rle, width, height, path):
        if literal is None:
            crack[at // 4 : stop // 4] = repeated > 0
        else:  # literal values at..stop-1: the alpha ones from the first index that is 3 mod 4
            crack[at // 4 : stop // 4] = literal[(3 - at) % 4 :: 4] > 0
    return crack.reshape(height, width)


class _Brush:
    """A brush's pixels as a mask shape's patch: checked against the size its result states when read, decoded
    ((height, width) bool) each time it is indexed, so that no canvas is allocated before import has matched
    that size to the photo, and only one brush is in memory at a time."""

    def __init__(self, rle: np.ndarray, width: int, height: int, path: Path):
        self.rle, self.shape, self.path = rle, (height, width), path
        for _ in _brush_runs(rle, width, height, path, values=False):  # a malformed RLE is refused now, not when drawn
            pass

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        decoded = brush_decode(self.rle, self.shape[1], self.shape[0], self.path)
        return decoded if dtype is None else decoded.astype(dtype)

    def __getitem__(self, index) -> np.ndarray:
        return np.asarray(self)[index]


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


def labelstudio_document(items: Iterable[tuple[str, np.ndarray]], rle: bool, prefix: str = "") -> list[dict]:
    """Label Studio tasks with the masks as predictions (pre-annotations): a polygon per crack, or one brush per image;
    each image named :func:`task_image` (``prefix``, its name)."""
    return [{"data": {LS_TO: task_image(prefix, name)},
             "predictions": [{"model_version": f"crackseg {__version__}", "result": labelstudio_results(mask, rle)}]}
            for name, mask in items]


def labelstudio_results(mask: np.ndarray, rle: bool, names: tuple[str, str] = (LS_FROM, LS_TO), label: str = CRACK) -> list[dict]:
    """One image's results: a ``brushlabels`` brush of the whole mask, or a ``polygonlabels`` polygon per crack;
    ``names`` are the (from_name, to_name) of the labelling config's tags, ``label`` the crack's label value."""
    height, width = mask.shape
    common = {"from_name": names[0], "to_name": names[1], "original_width": width, "original_height": height, "image_rotation": 0}
    if rle:
        values = [{"format": "rle", "rle": brush_encode(mask), "brushlabels": [label]}] if mask.any() else []
    else:
        values = [{"points": (edge_polygon(component, origin) * [100.0 / width, 100.0 / height]).tolist(),
                   "polygonlabels": [label], "closed": True} for component, origin in crack_components(mask)]
    kind = "brushlabels" if rle else "polygonlabels"
    return [common | {"id": f"crack{number}", "type": kind, "value": value} for number, value in enumerate(values, 1)]
