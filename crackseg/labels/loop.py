"""``crackseg labels``: annotation files -> a crackseg dataset; predictions -> pre-annotations; what to label next.

- :func:`import_labels` reads a COCO, labelme, CVAT or Label Studio file (in each tool's own
  coordinates, :mod:`crackseg.labels.formats`), finds its images in a folder (EXIF orientation
  applied, as every tool shows them) and writes ``DATASET/images/``, ``DATASET/masks/<stem>.png``
  (0/255) and ``DATASET/labels.json``: the source, the format, the labels used and every count
  (shapes per kind, clipped, zero-area, labels left out, images not listed, annotations passed
  over). Nothing is dropped without being counted there. A labelme file whose photo the folder
  lacks gives the photo it embeds (imageData), as labelme shows it. Every mask is drawn (to a temp)
  before a file of the dataset is replaced, and --overwrite removes only files an earlier import
  wrote (labels.json's files_written), never a photo of --images (which may be DATASET/images).
- :func:`export_labels` turns a predictions folder's masks into pre-annotations a person corrects
  in the labelling tool.
- :func:`rank_predictions` orders a predictions folder's photos by how unsure the model was
  (:func:`crackseg.prediction.uncertainty.uncertainty`, read from the saved probability maps) into ``rank.csv``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import numpy as np

from crackseg.core.errors import InputError, require
from crackseg.core.files import PendingFile, ensure_writable_folder, link_atomic, remove_orphan_temps, write_atomic, write_csv
from crackseg.core.version import __version__
from crackseg.data.images import DECODE_ERRORS, IMAGE_SUFFIXES, describe_error, read_probability
from crackseg.labels.formats.coco import coco_document
from crackseg.labels.formats.cvat import cvat_document
from crackseg.labels.formats.label_studio import labelstudio_document
from crackseg.labels.formats.labelme import embedded_photo, labelme_document
from crackseg.labels.formats.reading import read_annotations
from crackseg.labels.formats.shapes import LabelledImage, paint_all
from crackseg.labels.photos import PhotoIndex, match_photos, photos_below, shown_size
from crackseg.labels.options import ImportOptions
from crackseg.prediction.outputs import PredictionsFolder, read_saved_mask
from crackseg.prediction.uncertainty import uncertainty
from crackseg.prediction.pictures import write_png

DRAWN = ("polygon", "line", "mask")  # shape kinds that become crack pixels; others (rectangles, points) are counted


def import_labels(annotations: Path, fmt: str, images: Path, out: Path, options: ImportOptions = ImportOptions()) -> dict:
    """Write the crackseg dataset ``out`` from an annotation file and the photos in ``images``; returns labels.json's content."""
    if fmt != "labelme":  # before any work: polygons and COCO RLE are drawn by pycocotools
        require("pycocotools.mask", "labels", f"reading {fmt} files")
    found = read_annotations(annotations, fmt, skip=Path(out) / "labels.json")
    if not found.images:  # an empty dataset written with exit status 0 would look like a successful import
        unlabelled = f" ({found.unlabelled} tasks have no submitted annotation: predictions or drafts only)" if found.unlabelled else ""
        raise InputError(f"{annotations}: no annotated image to import{unlabelled}; nothing was written")
    wanted = {name.lower() for name in options.labels}
    known = {name.lower() for name in found.labels}
    unmatched = sorted(wanted - known)
    if known and unmatched:
        raise InputError(f"--label {unmatched[0]} matches no label in {annotations} (its labels: {', '.join(sorted(found.labels))})")
    photos = photos_below(Path(images), Path(out))
    matched = match_photos(found.images, PhotoIndex(photos, uploads=fmt == "labelstudio"), annotations, Path(out))
    cracks = [shape for image in matched.values() for shape in image.shapes if shape.label.lower() in wanted]
    refused = next((shape.refused for shape in cracks if shape.refused), None)
    if refused:
        raise InputError(refused)
    lines = sum(shape.kind == "line" and shape.width is None for shape in cracks)
    if lines and options.line_width is None:
        raise InputError(f"{annotations} holds {lines} lines (polylines, linestrips): give --line-width PX, the crack width to draw them")
    sizes = {photo: shown_size(photo, image, annotations) for photo, image in matched.items()}
    earlier, made = _prepare(Path(out), options.overwrite)
    tally = {key: Counter() for key in ("shapes", "labels", "left_out", "not_drawn")} | {"clipped": 0, "zero_area": 0, "crack_free": 0}
    staged = []  # each mask under a temp name: no file of the dataset is replaced before every mask is drawn
    try:
        for photo, image in matched.items():
            mask = _draw(image, sizes[photo], wanted, options.line_width, tally)
            tally["crack_free"] += not mask.any()
            staged.append(PendingFile(Path(out) / "masks" / f"{photo.stem}.png"))
            write_png(staged[-1].temp, mask.astype(np.uint8) * 255)
        for pending in staged:
            pending.commit()
    except BaseException:
        for pending in staged:
            pending.abort()
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    stems = sorted(photo.stem for photo in matched)
    written = {f"masks/{stem}.png" for stem in stems} | _place_photos(matched, Path(out), earlier)
    kept = _remove_leftovers(Path(out), earlier, written, photos)
    listed = {photo.relative_to(Path(images)).as_posix() for photo, image in matched.items() if image.embedded_in is None}
    provenance = {
        "source": str(Path(annotations).resolve()), "format": fmt, "images_folder": str(Path(images).resolve()),
        "crackseg": __version__, "labels": dict(tally["labels"]), "left_out_labels": dict(tally["left_out"]),
        "images": len(matched), "crack_free": tally["crack_free"], "shapes": dict(tally["shapes"]),
        "not_drawn": dict(tally["not_drawn"]), "clipped": tally["clipped"], "zero_area": tally["zero_area"],
        "line_width_px": options.line_width, "unlabelled_tasks": found.unlabelled,
        "cancelled_annotations": found.cancelled, "tasks_with_several_annotations": found.several,
        "json_files_skipped": found.other_json,
        "photos_from_image_data": sorted(photo.name for photo, image in matched.items() if image.embedded_in is not None),
        "images_not_listed": sorted(set(photos) - listed), "stems": stems, "files_written": sorted(written | kept),
    }
    write_atomic(Path(out) / "labels.json", json.dumps(provenance, indent=1) + "\n")
    return provenance


def import_summary(provenance: dict, out: Path) -> str:
    """One paragraph for the terminal: what was imported and everything that was not."""
    kinds = ", ".join(f"{count} {kind}s" for kind, count in sorted(provenance["shapes"].items())) or "no shapes"
    lines = [f"imported {provenance['images']} images ({provenance['crack_free']} crack-free) into {out} "
             f"from {provenance['format']}: {kinds}; {provenance['clipped']} clipped at the image edge, {provenance['zero_area']} zero-area"]
    if provenance["left_out_labels"]:
        lines.append("left out (not crack labels): " + ", ".join(f"{n} {label!r}" for label, n in sorted(provenance["left_out_labels"].items())))
    if provenance["not_drawn"]:
        lines.append("crack shapes without an outline, not drawn: " + ", ".join(f"{n} {k}" for k, n in sorted(provenance["not_drawn"].items())))
    if provenance["images_not_listed"]:
        lines.append(f"{len(provenance['images_not_listed'])} images in the folder are not in the file and were not imported")
    if provenance["unlabelled_tasks"]:
        lines.append(f"{provenance['unlabelled_tasks']} tasks without a submitted annotation were not imported")
    if provenance["cancelled_annotations"]:
        lines.append(f"{provenance['cancelled_annotations']} cancelled or skipped annotations were not imported")
    if provenance["tasks_with_several_annotations"]:
        lines.append(f"{provenance['tasks_with_several_annotations']} tasks had several annotations: "
                     "the one marked ground truth, else the newest, was imported")
    if provenance["json_files_skipped"]:
        lines.append(f"skipped {provenance['json_files_skipped']} JSON files that are not labelme annotations")
    if provenance["photos_from_image_data"]:
        lines.append(f"{len(provenance['photos_from_image_data'])} photos not in --images were taken from their labelme files' imageData")
    return "\n".join(lines + [f"details: {Path(out) / 'labels.json'}"])


def _place_photos(matched: dict[Path, LabelledImage], out: Path, earlier: list[str]) -> set[str]:
    """Each photo into ``out``/images/ (linked, or its labelme file's imageData written); returns those crackseg wrote
    there: not a photo that lay there already (--images OUT/images), the user's, unless an earlier import wrote it."""
    in_place = {photo for photo, image in matched.items()
                if image.embedded_in is None and (out / "images" / photo.name).resolve() == photo.resolve()}
    for photo, image in matched.items():
        if image.embedded_in is None:
            link_atomic(photo, out / "images" / photo.name)
        else:
            write_atomic(photo, embedded_photo(image))
    return {f"images/{photo.name}" for photo in matched if photo not in in_place or f"images/{photo.name}" in earlier}


def _prepare(out: Path, overwrite: bool) -> tuple[list[str], list[Path]]:
    """Check ``out`` before any work; returns the files an earlier import wrote there (``images/NAME``,
    ``masks/NAME``) and the folders made now, to remove again if the import fails."""
    provenance = out / "labels.json"
    if provenance.is_dir():
        raise InputError(f"{provenance} is a folder, not a file; import writes its record there: move it or choose another --out")
    for folder in (out / "images", out / "masks"):
        if os.path.lexists(folder) and not folder.is_dir():
            what = "a file" if folder.exists() else "a broken link"
            raise InputError(f"{folder} is {what}, not a folder; import writes the {folder.name} there: move it or choose another --out")
        if folder.is_dir():
            remove_orphan_temps(folder)  # what an interrupted import left
    existing = [folder for folder in (out / "images", out / "masks") if folder.is_dir() and any(folder.iterdir())]
    existing += [provenance] if provenance.exists() else []
    if existing and not overwrite:
        raise InputError(f"{existing[0]} already exists; choose another --out or pass --overwrite")
    made = [folder for folder in (out, out / "images", out / "masks") if not folder.exists()]
    ensure_writable_folder(out, "--out")
    for folder in (out / "images", out / "masks"):
        folder.mkdir(exist_ok=True)
    try:
        earlier = json.loads(provenance.read_text()) if provenance.exists() else {}
        if "files_written" in earlier:
            return [str(name) for name in earlier["files_written"]], made
        stems = set(earlier.get("stems", []))  # a crackseg before files_written: the masks and photos of its stems
        photos = [f"images/{path.name}" for path in (out / "images").iterdir() if path.stem in stems]
        return [f"masks/{stem}.png" for stem in stems] + photos, made
    except (OSError, ValueError, AttributeError, TypeError):
        return [], made


def _remove_leftovers(out: Path, earlier: list[str], written: set[str], inputs: dict[str, Path]) -> set[str]:
    """Remove the files an earlier import wrote in images/ or masks/ that this one did not (photos no longer listed,
    a suffix that changed), but never an input: --images may be OUT/images itself. Returns those kept."""
    protected, kept = {path.resolve() for path in inputs.values()}, set()
    for name in set(earlier) - written:
        path, parts = out / name, PurePosixPath(name).parts
        if len(parts) != 2 or parts[0] not in ("images", "masks") or parts[1] in (".", "..") or not path.is_file():
            continue  # not a file crackseg writes (a labels.json edited by hand), or gone
        if path.resolve() in protected:
            kept.add(name)
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            path.unlink()
    return kept


def _draw(image: LabelledImage, size: tuple[int, int], wanted: set[str], line_width: float | None, tally: dict) -> np.ndarray:
    """(H, W) bool: the crack shapes of one image drawn as their tool draws them; every shape counted in ``tally``."""
    canvas, drawn = np.zeros((size[1], size[0]), bool), []
    for shape in image.shapes:
        if shape.label.lower() not in wanted:
            tally["left_out"][shape.label] += 1
        elif shape.kind not in DRAWN:
            tally["not_drawn"][shape.kind] += 1
        else:
            drawn.append(shape)
    for shape, (pixels, clipped) in zip(drawn, paint_all(canvas, drawn, line_width)):
        tally["shapes"][shape.kind] += 1
        tally["labels"][shape.label] += 1
        tally["clipped"] += clipped
        tally["zero_area"] += pixels == 0
    return canvas


def export_labels(predictions: Path, fmt: str, out: Path, rle: bool = False, overwrite: bool = False, image_prefix: str = "") -> dict:
    """Pre-annotations of a predictions folder's masks in ``fmt``, the images named as the tool will see them
    (``image_prefix`` + the photo's path below predict's input); returns what was written."""
    if fmt == "coco" and rle:
        require("pycocotools.mask", "labels", "writing COCO RLE")
    folder = PredictionsFolder(predictions)
    entries, rasters = [], 0
    for number, row in enumerate(folder.read_predictions(), 1):
        mask_path = folder.table_path(row.get("mask") or "", "mask", number)  # inside the folder, or refused
        if mask_path.suffix.lower() == ".tif":
            rasters += 1  # rasters predicted by windows: labelling tools take photos
            continue
        name = folder.name_of(mask_path)
        entries.append((name, (PurePosixPath(name).parent / Path(row["path"]).name).as_posix(), mask_path))
    out = Path(out)
    if fmt == "labelme":  # a file beside each photo, in a folder
        if out.exists() and not out.is_dir():
            raise InputError(f"--out {out}: a file; labelme's files go beside each photo, in a folder: give a folder")
        targets = [_inside(out, f"{name}.json") for name, _, _ in entries]
    else:
        suffix = ".xml" if fmt == "cvat" else ".json"
        if out.is_dir():
            raise InputError(f"--out {out}: a folder; {fmt} writes one file: give its name, e.g. {out / (fmt + suffix)}")
        if out.suffix.lower() != suffix:  # the labelling tool picks the file's reader by it
            raise InputError(f"--out {out}: a {fmt} file is a {suffix} file; e.g. --out {out.with_suffix(suffix)}")
        targets = [out]
    existing = [target for target in targets if target.exists()]
    if existing and not overwrite:
        raise InputError(f"{existing[0]} already exists; choose another --out or pass --overwrite")
    items = ((image_prefix + shown, read_saved_mask(path)) for _, shown, path in entries)  # one mask in memory at a time
    if fmt == "labelme":  # beside each photo: imagePath is the photo's file name
        _write_all(targets, (json.dumps(labelme_document(image_prefix + PurePosixPath(shown).name, read_saved_mask(path), rle),
                                        indent=1) + "\n" for _, shown, path in entries))
    elif fmt == "cvat":
        write_atomic(out, cvat_document(items, rle))
    elif fmt == "coco":
        write_atomic(out, json.dumps(coco_document(items, rle)) + "\n")
    else:  # Label Studio's names are URLs where the prefix makes them so: the prefix stays apart, the name is encoded
        named = ((shown, read_saved_mask(path)) for _, shown, path in entries)
        write_atomic(out, json.dumps(labelstudio_document(named, rle, image_prefix)) + "\n")
    return {"format": fmt, "out": str(out), "images": len(entries), "rasters_left_out": rasters, "shapes": "rle" if rle else "polygons"}


def _write_all(targets: list[Path], contents: Iterable[str]) -> None:
    """Each of ``contents`` to its target, staged under temp names and renamed only once every one is made (a mask
    that cannot be read leaves no file replaced, and no folder made)."""
    made = sorted({folder for target in targets for folder in (target.parent, *target.parent.parents) if not folder.exists()},
                  key=lambda folder: len(folder.parts), reverse=True)
    staged = []
    try:
        for target, content in zip(targets, contents):
            staged.append(PendingFile(target))
            staged[-1].write(content.encode())
        for pending in staged:
            pending.commit()
    except BaseException:
        for pending in staged:
            pending.abort()
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _inside(out: Path, relative: str) -> Path:
    """``out / relative``, which must stay inside ``out`` (not absolute, no ``..``): a labelme file is written nowhere
    else, whatever name a predictions folder gives."""
    target = out / relative
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        raise InputError(f"{target}: outside --out {out}; an output name may not climb out of it (predict again)")
    return target


def rank_predictions(predictions: Path, threshold: float | None = None) -> tuple[list[dict], int]:
    """PREDICTIONS/rank.csv: the photos by :func:`crackseg.prediction.uncertainty.uncertainty`, most unsure first, from the
    saved probability maps at ``threshold`` (default: the one predict used); returns its rows and the number of
    rasters left out."""
    folder = PredictionsFolder(predictions)
    rows = folder.read_predictions()
    threshold = _summary_threshold(folder) if threshold is None else threshold
    ranked, rasters = [], 0
    for number, row in enumerate(rows, 1):
        mask_path = folder.table_path(row.get("mask") or "", "mask", number)  # inside the folder, or refused
        if mask_path.suffix.lower() == ".tif":
            rasters += 1
            continue
        path = folder.probabilities(folder.name_of(mask_path))
        if not path.is_file():
            raise InputError(f"{path}: no probability map; rank reads them: predict again with --save-prob 8 (or 16)")
        try:
            prob = read_probability(path).numpy()
        except DECODE_ERRORS as error:
            raise InputError(f"{path}: {describe_error(error)}") from None
        ranked.append({"path": row["path"], **uncertainty(prob, threshold)})
    ranked.sort(key=lambda item: (-item["uncertainty"], -item["unsure_crack_share"], item["path"]))
    ranked = [{"rank": number, **item} for number, item in enumerate(ranked, 1)]
    write_csv(folder.rank_csv, ranked, ["rank", "path", "uncertainty", "unsure_crack_share"])
    return ranked, rasters


def _summary_threshold(folder: PredictionsFolder) -> float:
    """The decision threshold predict used, from its summary.json: a number strictly between 0 and 1 (at 0 or 1, NaN
    or 7 every pixel would be sure, and every photo rank 0)."""
    try:
        threshold = json.loads(folder.summary_json.read_text())["threshold"]
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(f"{folder.summary_json} names no decision threshold (an older crackseg wrote it): give --threshold") from None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise InputError(f"{folder.summary_json}: threshold {threshold!r} is not a number between 0 and 1: give --threshold")
    return float(threshold)
