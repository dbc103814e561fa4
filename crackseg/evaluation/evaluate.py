"""Score crack predictions against ground truth with the metrics of the crack literature.

Two sources of predictions: saved files (binary masks or 8/16-bit probability maps, as
``crackseg predict`` writes them), or a checkpoint run on a dataset split. Under the
default protocol, ``crackseg``, every figure comes from the per-threshold histograms of
:mod:`crackseg.evaluation.metrics`, the code that also scores validation during training; the other
protocols (:mod:`crackseg.evaluation.protocols`) reproduce a paper's evaluation code, to set crackseg
beside its table. Photos whose ground truth has no crack are also reported apart: how many
get a predicted crack, counted as ``predict`` counts cracks; and false alarms far from any
crack, in every photo (:mod:`crackseg.evaluation.false_alarms`). The report states each
definition next to its number.
"""

from __future__ import annotations

import json
import math
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from crackseg.core.config import ALARM_DISTANCE, ALARM_TILE, JOIN_GAP, MIN_LENGTH, InferenceOptions, parse_length
from crackseg.core.errors import InputError
from crackseg.core.files import ensure_writable_folder, write_atomic, write_csv
from crackseg.core.storage import delete_file, display_url, is_url, list_keys, upload_file
from crackseg.cracks.measure import find_cracks
from crackseg.data.datasets import Folder, files_by_stem, open_dataset, read_stems
from crackseg.data.images import DECODE_ERRORS, IMAGE_SUFFIXES, describe_error, load_image, load_mask, read_probability
from crackseg.evaluation.false_alarms import add_false_alarms, format_alarms, image_alarms
from crackseg.evaluation.metrics import (
    average_precision,
    background_iou,
    best_f1,
    optimal_image_scale,
    scores_at,
    sweep,
    threshold_histograms,
)
from crackseg.evaluation.protocols import DEFINITIONS as PROTOCOL_DEFINITIONS
from crackseg.evaluation.protocols import PROTOCOLS, REFERENCES, SCORES, image_counts

DEFINITIONS = {
    "precision, recall, f1": "dataset level: counts summed over all images, then divided, at the operating threshold; "
    "with tolerance T a predicted crack pixel is correct if a true crack pixel lies within T px, and a true crack "
    "pixel is found if a predicted one lies within T px",
    "iou_crack": "strict pixel IoU of the crack class (tolerance 0), dataset level",
    "iou_background": "strict pixel IoU of the background class (tolerance 0), dataset level",
    "miou": "mean of iou_crack and iou_background",
    "per_image_mean": "F1 (with tolerance) and strict crack IoU computed per image at the operating threshold, then "
    "averaged; an image with no true and no predicted crack pixels scores 1",
    "ods": "optimal dataset scale: the single threshold (of 499, evenly spaced in logit: 0.01 apart near 0.5, finer towards 0 and 1) with the best dataset-level F1",
    "ois": "optimal image scale: each image's best F1 over the 499 thresholds, averaged over images (the convention "
    "of the DeepCrack / CrackForest evaluation code)",
    "ap": "average precision: area under the dataset-level precision-recall curve over the 499 thresholds",
}
CRACK_FREE_DEFINITION = (
    "images whose ground truth has no crack pixel, also reported apart: how many get at least one predicted crack (the mask "
    "predict writes, probability >= the threshold, cut into cracks as predict counts them: pieces joined across gaps up to "
    "join_gap_px, cracks shorter than min_length_px left out), and the mask's crack pixels per megapixel of these images; "
    "every other figure counts them as before"
)
MIN_LENGTH_PX, JOIN_GAP_PX = parse_length(MIN_LENGTH)[0], parse_length(JOIN_GAP)[0]  # predict's defaults


@dataclass(frozen=True)
class Scoring:
    """What to report besides the tolerance and threshold: the protocol (one of crackseg.evaluation.protocols.PROTOCOLS);
    in px, how predicted cracks on crack-free photos are counted (predict's --min-length and --join-gap), and how far from
    every true crack a predicted pixel is a far alarm, and the side of the tiles checked for alarms
    (crackseg.evaluation.false_alarms)."""

    protocol: str = "crackseg"
    min_length: float = MIN_LENGTH_PX
    join_gap: float = JOIN_GAP_PX
    alarm_distance: float = ALARM_DISTANCE
    alarm_tile: int = ALARM_TILE

    def check(self, tolerance: float) -> None:
        if self.protocol not in PROTOCOLS:
            raise InputError(f"--protocol {self.protocol}: choose one of {', '.join(PROTOCOLS)}")
        if tolerance > 0 and self.protocol != "crackseg":
            own = "centrelines within its own 4 px disk" if self.protocol == "omnicrack" else "exact pixels, as its reference does"
            raise InputError(f"--tolerance belongs to the crackseg protocol; --protocol {self.protocol} compares {own}: leave --tolerance out")
        for name in ("min_length", "join_gap"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InputError(f"--{name.replace('_', '-')} must be a length in px, 0 or more, got {value}")
        if not (math.isfinite(self.alarm_distance) and self.alarm_distance >= 0):
            raise InputError(f"--alarm-distance must be a length in px, 0 or more, got {self.alarm_distance}")
        if not (isinstance(self.alarm_tile, int) and self.alarm_tile >= 1):
            raise InputError(f"--alarm-tile must be a whole number of px, 1 or more, got {self.alarm_tile}")


@dataclass(frozen=True)
class ImageScore:
    """One image's contribution to a report."""

    name: str
    crack_pixels: int  # in its ground truth
    scores: object  # crackseg: (strict, tolerant) histograms; other protocols: crackseg.evaluation.protocols.image_counts
    false_alarm: dict | None  # a crack-free image: the cracks and crack pixels predicted on it; else None
    far_alarms: dict | None = None  # crackseg.evaluation.false_alarms.image_alarms' counts; None under protocols without them


def score_image(prob: torch.Tensor, truth: torch.Tensor, tolerance: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Strict (tolerance 0) and tolerant (3, BINS) histograms of one (H, W) image."""
    if prob.shape != truth.shape:
        raise InputError(f"prediction is {tuple(prob.shape)} px but its ground truth is {tuple(truth.shape)}")
    strict = threshold_histograms(prob, truth)
    return strict, (threshold_histograms(prob, truth, tolerance=tolerance) if tolerance > 0 else strict)


def score_one(name: str, prob: torch.Tensor, truth: torch.Tensor, tolerance: float, threshold: float,
              scoring: Scoring = Scoring()) -> ImageScore:
    """Score one (H, W) probability map against its (H, W) bool ground truth as ``scoring`` says."""
    if prob.shape != truth.shape:
        raise InputError(f"prediction is {tuple(prob.shape)} px but its ground truth is {tuple(truth.shape)}")
    if scoring.protocol == "crackseg":
        scores = score_image(prob, truth, tolerance)
    else:
        scores = image_counts(scoring.protocol, prob.cpu().numpy(), truth.cpu().numpy(), threshold)
    crack_pixels = int(truth.sum())
    far_alarms = image_alarms(prob, truth, threshold, scoring.protocol, scoring.alarm_distance, scoring.alarm_tile)
    return ImageScore(name, crack_pixels, scores, None if crack_pixels else _false_alarm(prob, threshold, scoring), far_alarms)


def _false_alarm(prob: torch.Tensor, threshold: float, scoring: Scoring) -> dict:
    """The cracks predict would count on a crack-free photo, and the crack pixels of its mask."""
    mask = (prob >= threshold).cpu().numpy()
    cracks = find_cracks(mask, scoring.join_gap, scoring.min_length)[1]
    return {"cracks": len(cracks), "crack_pixels": int(mask.sum()), "pixels": int(mask.size)}


def evaluate_files(pred: Path, gt: Path, split: Path | None = None, tolerance: float = 0.0, threshold: float = 0.5,
                   scoring: Scoring = Scoring()) -> dict:
    """Score ``pred/<stem>.png`` against ``gt/<stem>.*`` for every stem of ``split`` (default: all of gt)."""
    scoring.check(tolerance)
    truths = files_by_stem(Path(gt))
    if not truths:
        raise InputError(f"{gt}: no ground-truth masks in it ({', '.join(IMAGE_SUFFIXES)})")
    predictions = files_by_stem(Path(pred))
    expected = read_stems(split) if split else sorted(truths)
    unknown = [stem for stem in expected if stem not in truths]
    if unknown:
        raise InputError(f"{split}: lists {len(unknown)} stems with no ground-truth mask in {gt} (e.g. {unknown[0]})")
    missing = [stem for stem in expected if stem not in predictions]
    if missing:
        raise InputError(f"{len(missing)} ground-truth masks have no prediction in {pred} (e.g. {missing[0]}); predict them first")

    def one(stem: str):
        prob = _read(read_probability, predictions[stem])
        truth = _read(load_mask, truths[stem])[0].bool()
        try:
            return score_one(stem, prob, truth, tolerance, threshold, scoring)
        except InputError as error:
            raise InputError(f"{predictions[stem]}: {error}") from None

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, expected))
    return build_report(results, tolerance, threshold, scoring)


def _read(reader, path: Path):
    try:
        return reader(path)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: {describe_error(error)}") from None


def evaluate_checkpoint(checkpoint: Path, root: Folder, split: str = "test", tolerance: float = 0.0, threshold: float | None = None,
                        inference: InferenceOptions = InferenceOptions(), scoring: Scoring = Scoring()) -> dict:
    """Predict the images of a dataset split with ``checkpoint`` in this process, run as ``inference`` says, and score them.

    ``root`` may be an s3:// prefix (as text): its files are read one by one, never copied to disk, and the report names it
    as :func:`crackseg.core.storage.display_url` shows it."""
    from crackseg.model.inference import Predictor
    from crackseg.model.runtimes import choose_runtime, load_runtime

    scoring.check(tolerance)
    choice = choose_runtime(Path(checkpoint), inference)
    root = str(root) if is_url(str(root)) else Path(root)
    shown = display_url(str(root))
    found = open_dataset(root)
    if found.problems:
        raise InputError(f"{len(found.problems)} problems in {shown}, e.g. {found.problems[0]}; see crackseg inspect {shown}")
    if split == "all":
        stems = [sample.stem for sample in found.samples]
    elif Path(split).suffix == ".txt" or Path(split).is_file():
        stems = read_stems(Path(split))
    elif split in found.listed:
        stems = found.listed[split]
    else:
        raise InputError(f"--split {split}: no {split}.txt in {shown}; give a split name that has one, all, or a file of stems")
    samples = {sample.stem: sample for sample in found.samples}
    unknown = [stem for stem in stems if stem not in samples]
    if unknown:
        raise InputError(f"--split lists {len(unknown)} stems not in {shown} (e.g. {unknown[0]})")
    runtime = load_runtime(choice)
    threshold = runtime.threshold if threshold is None else threshold
    predictor = Predictor(runtime.model, runtime.device, inference, runtime.amp_dtype)
    images = ((index, _read(load_image, samples[stem].image)) for index, stem in enumerate(stems))
    results = []
    for index, prob in predictor.probabilities(images):
        truth = _read(load_mask, samples[stems[index]].mask)[0].bool()
        results.append(score_one(stems[index], prob, truth, tolerance, threshold, scoring))
    report = build_report(sorted(results, key=lambda result: result.name), tolerance, threshold, scoring)
    report["source"] = {"checkpoint": str(checkpoint), "data": shown, "split": split}
    return report


def build_report(results: list[ImageScore], tolerance: float, threshold: float, scoring: Scoring = Scoring()) -> dict:
    """The report of ``scoring.protocol`` from each image's scores, with crack-free photos reported apart and,
    under a protocol with an operating threshold, false alarms far from any crack."""
    if scoring.protocol == "crackseg":
        report = _crackseg_report(results, tolerance, threshold)
    else:
        report = _protocol_report(results, threshold, scoring.protocol)
    report = _with_crack_free(report, results, threshold, scoring)
    alarms = {r.name: r.far_alarms for r in results if r.far_alarms is not None}
    return add_false_alarms(report, alarms, scoring.alarm_distance, scoring.alarm_tile)


def _crackseg_report(results: list[ImageScore], tolerance: float, threshold: float) -> dict:
    strict = torch.stack([r.scores[0] for r in results]).sum(0)
    tolerant = torch.stack([r.scores[1] for r in results]).sum(0)
    operating = scores_at(tolerant, threshold)
    crack_iou = scores_at(strict, threshold).iou
    back_iou = background_iou(strict, threshold)
    ods = best_f1(tolerant)
    ois = optimal_image_scale([r.scores[1] for r in results])
    rows = []
    for name, (image_strict, image_tolerant) in ((r.name, r.scores) for r in results):
        at = scores_at(image_tolerant, threshold)
        rows.append({
            "image": name,
            "crack_pixels": int(image_strict[2].sum()),
            "precision": round(at.precision, 6), "recall": round(at.recall, 6), "f1": round(at.f1, 6),
            "iou": round(scores_at(image_strict, threshold).iou, 6),
            "best_f1": round(best_f1(image_tolerant).f1, 6),  # this image's OIS term
        })
    rows.sort(key=lambda row: (row["f1"], row["iou"], row["image"]))
    return {
        "protocol": "crackseg",
        "images": len(results),
        "tolerance_px": tolerance,
        "threshold": operating.threshold,  # the grid threshold scored, the nearest to the one asked for
        "dataset": {
            "precision": operating.precision, "recall": operating.recall, "f1": operating.f1,
            "iou_crack": crack_iou, "iou_background": back_iou, "miou": (crack_iou + back_iou) / 2,
        },
        "per_image_mean": {"f1": float(np.mean([r["f1"] for r in rows])), "iou": float(np.mean([r["iou"] for r in rows]))},
        "ods": {"f1": ods.f1, "threshold": ods.threshold, "precision": ods.precision, "recall": ods.recall},
        "ois": {"f1": ois},
        "ap": average_precision(tolerant),
        "worst_images": [row["image"] for row in rows[:10]],
        "definitions": DEFINITIONS,
        "per_image": rows,
        "pr_curve": [{"threshold": s.threshold, "precision": s.precision, "recall": s.recall, "f1": s.f1} for s in sweep(tolerant)],
    }


_WORST_FIRST = {"scsegamba": ("f1", "best_f1"), "deepsegmentor": ("f1", "recall"), "omnicrack": ("cliou",)}


def _protocol_report(results: list[ImageScore], threshold: float, protocol: str) -> dict:
    """The report of a literature protocol (crackseg.evaluation.protocols) from each image's counts."""
    figures, image_figures, curve = SCORES[protocol]([r.scores for r in results])
    rows = [{"image": r.name, "crack_pixels": r.crack_pixels, **{key: round(value, 6) if isinstance(value, float) else value
                                                                  for key, value in values.items()}}
            for r, values in zip(results, image_figures)]
    rows.sort(key=lambda row: (*(row[key] for key in _WORST_FIRST[protocol]), row["image"]))
    return {
        "protocol": protocol,
        "reference": REFERENCES[protocol],
        "images": len(results),
        **({"threshold": threshold} if protocol == "omnicrack" else {}),
        **figures,
        "worst_images": [row["image"] for row in rows[:10]],
        "definitions": PROTOCOL_DEFINITIONS[protocol],
        "per_image": rows,
        **({"pr_curve": curve} if curve else {}),
    }


def _with_crack_free(report: dict, results: list[ImageScore], threshold: float, scoring: Scoring) -> dict:
    """``report`` with ``crack_free`` (after worst_images) and its definition, and the per-image rows marked,
    when some ground truth is crack-free; unchanged otherwise."""
    free = {r.name: r.false_alarm for r in results if r.false_alarm is not None}
    if not free:
        return report
    summary = {
        "images": len(free),
        "with_predicted_cracks": sum(alarm["cracks"] > 0 for alarm in free.values()),
        "false_crack_pixels_per_megapixel": 1e6 * sum(a["crack_pixels"] for a in free.values()) / sum(a["pixels"] for a in free.values()),
        "threshold": threshold,
        "min_length_px": scoring.min_length,
        "join_gap_px": scoring.join_gap,
    }
    for row in report["per_image"]:
        alarm = free.get(row["image"])
        row["crack_free"] = int(alarm is not None)
        if alarm is not None:
            row["false_cracks"], row["false_crack_pixels"] = alarm["cracks"], alarm["crack_pixels"]
    marked = {}
    for key, value in report.items():
        marked[key] = {**value, "crack_free": CRACK_FREE_DEFINITION} if key == "definitions" else value
        if key == "worst_images":
            marked["crack_free"] = summary
    return marked


def format_table(report: dict) -> str:
    lines = _TABLES[report.get("protocol", "crackseg")](report)
    if "crack_free" in report:
        free = report["crack_free"]
        lines.append(f"  crack-free images {free['images']}: {free['with_predicted_cracks']} with a predicted crack, "
                     f"{free['false_crack_pixels_per_megapixel']:.1f} false crack pixels per megapixel")
    if "false_alarms" in report:
        lines.append(format_alarms(report["false_alarms"]))
    lines.append("  worst: " + ", ".join(report["worst_images"][:5]))
    return "\n".join(lines)


def _crackseg_table(report: dict) -> list[str]:
    d, ods, ois = report["dataset"], report["ods"], report["ois"]
    return [
        f"{report['images']} images, tolerance {report['tolerance_px']:g} px, operating threshold {report['threshold']:.4g}",
        f"  dataset   precision {d['precision']:.4f}  recall {d['recall']:.4f}  F1 {d['f1']:.4f}",
        f"            IoU crack {d['iou_crack']:.4f}  IoU background {d['iou_background']:.4f}  mIoU {d['miou']:.4f}  (strict pixels)",
        f"  per image mean F1 {report['per_image_mean']['f1']:.4f}  mean IoU {report['per_image_mean']['iou']:.4f}",
        f"  ODS F1 {ods['f1']:.4f} @ {ods['threshold']:.4g}   OIS F1 {ois['f1']:.4f}   AP {report['ap']:.4f}",
    ]


def _scsegamba_table(report: dict) -> list[str]:
    ods, miou, at_0 = report["ods"], report["miou"], report["at_0"]
    return [
        f"{report['images']} images, protocol scsegamba (per-image maps / max, 8 bits, thresholds 0.00-0.99, >)",
        f"  ODS F1 {ods['f1']:.4f} @ {ods['threshold']:.2f}   OIS F1 {report['ois']['f1']:.4f}   mIoU {miou['miou']:.4f} @ {miou['threshold']:.2f}",
        f"  at 0.00   precision {at_0['precision']:.4f}  recall {at_0['recall']:.4f}  F1 {at_0['f1']:.4f}  (its P, R, F1)",
    ]


def _deepsegmentor_table(report: dict) -> list[str]:
    ods = report["ods"]
    return [
        f"{report['images']} images, protocol deepsegmentor (8-bit maps, thresholds 0.00-0.99, >, counts summed over images)",
        f"  ODS @ {ods['threshold']:.2f}  precision {ods['precision']:.4f}  recall {ods['recall']:.4f}  F1 {ods['f1']:.4f}",
        f"            mIoU (I/U) {report['miou']['miou']:.4f}  global accuracy {report['global_accuracy']:.4f}  "
        f"class accuracy {report['class_accuracy']:.4f}",
    ]


def _omnicrack_table(report: dict) -> list[str]:
    pixels = report["centreline_pixels"]
    return [
        f"{report['images']} images, protocol omnicrack, operating threshold {report['threshold']:.4g}",
        f"  centreline IoU {report['cliou']:.4f} within {report['tolerance_px']} px  "
        f"(centreline pixels: {pixels['tp']} found, {pixels['fp']} false, {pixels['fn']} missed)",
    ]


_TABLES = {"crackseg": _crackseg_table, "scsegamba": _scsegamba_table, "deepsegmentor": _deepsegmentor_table,
           "omnicrack": _omnicrack_table}


REPORT_FILES = ("report.json", "report.md", "per_image.csv", "pr_curve.csv", "pr_curve.png")


def check_report_out(out: Path | str, overwrite: bool) -> None:
    """Before any work: ``out`` is a folder that can be written, or an s3:// prefix (a missing bucket or a refused
    request stops here), and holds no report unless ``overwrite``."""
    if is_url(str(out)) and not str(out).startswith("s3://"):
        raise InputError(f"--out {display_url(str(out))}: reports are written to a local folder or an s3://bucket/prefix/ URL")
    prefix = str(out).rstrip("/")
    found = "report.json" in list_keys(f"{prefix}/") if is_url(prefix) else (Path(out) / "report.json").exists()
    if found and not overwrite:
        raise InputError(f"{display_url(prefix) if is_url(prefix) else out}/report.json already exists; choose another --out or pass --overwrite")
    if not is_url(prefix):
        ensure_writable_folder(Path(out), "--out")


def write_report(report: dict, out: Path | str) -> None:
    """report.json, report.md, per_image.csv (worst first) in ``out``; pr_curve.csv and pr_curve.png where the
    protocol has a precision-recall curve (a curve left from another protocol is removed). An s3:// ``out`` gets them
    written in a temporary folder, then uploaded each whole (and a curve left there removed)."""
    if is_url(str(out)):
        prefix = str(out).rstrip("/")
        existing = set(list_keys(f"{prefix}/"))
        with tempfile.TemporaryDirectory(prefix="crackseg-report-") as folder:
            write_report(report, Path(folder))
            for name in REPORT_FILES:
                if (Path(folder) / name).exists():
                    upload_file(Path(folder) / name, f"{prefix}/{name}")
                elif name in existing:
                    delete_file(f"{prefix}/{name}")
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {key: value for key, value in report.items() if key not in ("per_image", "pr_curve")}
    curve = {"pr_curve": report["pr_curve"]} if "pr_curve" in report else {}
    write_atomic(out / "report.json", json.dumps({**summary, **curve}, indent=1) + "\n")
    rows = report["per_image"]
    columns = [key for key in dict.fromkeys(key for row in rows for key in row) if key != "far_alarm_pixels"]  # it goes last
    write_csv(out / "per_image.csv", rows, columns)
    if curve:
        write_csv(out / "pr_curve.csv", report["pr_curve"])
        _plot_pr_curve(report, out / "pr_curve.png")
    else:
        for name in ("pr_curve.csv", "pr_curve.png"):
            (out / name).unlink(missing_ok=True)
    protocol = report.get("protocol", "crackseg")
    source = f"Protocol: {protocol}" + (f", as {report['reference']} computes it" if "reference" in report else "")
    definitions = "\n".join(f"- **{name}**: {text}" for name, text in report["definitions"].items())
    write_atomic(out / "report.md", f"# Crack segmentation report\n\n{source}.\n\n```\n{format_table(report)}\n```\n\n"
                                    f"## Definitions\n\n{definitions}\n")


def _plot_pr_curve(report: dict, path: Path, size: int = 480, margin: int = 48) -> None:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    span = size - 2 * margin

    def point(recall: float, precision: float) -> tuple[float, float]:
        return margin + recall * span, size - margin - precision * span

    draw.rectangle([margin, margin, size - margin, size - margin], outline="black")
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x, y = point(tick, tick)
        draw.text((x - 8, size - margin + 6), f"{tick:.2f}", fill="black")
        draw.text((4, y - 6), f"{tick:.2f}", fill="black")
    draw.text((size / 2 - 20, size - 18), "recall", fill="black")
    scores = (f"AP {report['ap']:.3f}, " if "ap" in report else "") + f"ODS F1 {report['ods']['f1']:.3f}"
    draw.text((4, 8), f"precision   ({scores})", fill="black")
    curve = [point(p["recall"], p["precision"]) for p in report["pr_curve"]]
    draw.line(curve, fill=(200, 30, 30), width=2)
    ods = report["ods"]
    if "recall" in ods:  # a point of the curve (scsegamba's ODS is a mean of per-image F1, on no curve)
        x, y = point(ods["recall"], ods["precision"])
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], outline=(30, 30, 200), width=2)
    write_atomic(path, lambda file: image.save(file, "PNG"))

