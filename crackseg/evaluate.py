"""Score crack predictions against ground truth with the metrics of the crack literature.

Two sources of predictions: saved files (binary masks or 8/16-bit probability maps, as
``crackseg predict`` writes them), or a checkpoint run on a dataset split. Every figure
comes from the per-threshold histograms of :mod:`crackseg.metrics`, the code that also
scores validation during training. The report states each definition next to its number.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from crackseg.data import files_by_stem, open_dataset, read_stems
from crackseg.images import DECODE_ERRORS, IMAGE_SUFFIXES, describe_error, load_image, load_mask, read_probability
from crackseg.errors import InputError
from crackseg.files import write_atomic, write_csv
from crackseg.metrics import (
    average_precision,
    background_iou,
    best_f1,
    optimal_image_scale,
    scores_at,
    sweep,
    threshold_histograms,
)

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


def score_image(prob: torch.Tensor, truth: torch.Tensor, tolerance: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Strict (tolerance 0) and tolerant (3, BINS) histograms of one (H, W) image."""
    if prob.shape != truth.shape:
        raise InputError(f"prediction is {tuple(prob.shape)} px but its ground truth is {tuple(truth.shape)}")
    strict = threshold_histograms(prob, truth)
    return strict, (threshold_histograms(prob, truth, tolerance=tolerance) if tolerance > 0 else strict)


def evaluate_files(pred: Path, gt: Path, split: Path | None = None, tolerance: float = 0.0, threshold: float = 0.5) -> dict:
    """Score ``pred/<stem>.png`` against ``gt/<stem>.*`` for every stem of ``split`` (default: all of gt)."""
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
            return stem, *score_image(prob, truth, tolerance)
        except InputError as error:
            raise InputError(f"{predictions[stem]}: {error}") from None

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, expected))
    return build_report(results, tolerance, threshold)


def _read(reader, path: Path):
    try:
        return reader(path)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: {describe_error(error)}") from None


def evaluate_checkpoint(
    checkpoint: Path, root: Path, split: str = "test", tolerance: float = 0.0, threshold: float | None = None,
    device: str = "auto", tile: int = 1024, overlap: int = 128, batch_size: int | None = None, amp: str = "auto",
) -> dict:
    """Predict the images of a dataset split with ``checkpoint`` in this process and score them."""
    from crackseg.distributed import resolve_amp, select_device
    from crackseg.export import load_inference_model, resolve_backend
    from crackseg.inference import Predictor

    runtime = resolve_backend(Path(checkpoint)) != "torch"
    chosen = select_device("cpu" if runtime and device == "auto" else device)
    amp_dtype = None if runtime else resolve_amp(amp, chosen)
    found = open_dataset(Path(root))
    if found.problems:
        raise InputError(f"{len(found.problems)} problems in {root}, e.g. {found.problems[0]}; see crackseg inspect {root}")
    if split == "all":
        stems = [sample.stem for sample in found.samples]
    elif Path(split).suffix == ".txt" or Path(split).is_file():
        stems = read_stems(Path(split))
    elif split in found.listed:
        stems = found.listed[split]
    else:
        raise InputError(f"--split {split}: no {split}.txt in {root}; give a split name that has one, all, or a file of stems")
    samples = {sample.stem: sample for sample in found.samples}
    unknown = [stem for stem in stems if stem not in samples]
    if unknown:
        raise InputError(f"--split lists {len(unknown)} stems not in {root} (e.g. {unknown[0]})")
    model = load_inference_model(checkpoint, "auto", chosen, amp)
    threshold = model.threshold if threshold is None else threshold
    predictor = Predictor(model, chosen, tile=tile, overlap=overlap, batch_size=batch_size, amp_dtype=amp_dtype)
    images = ((index, _read(load_image, samples[stem].image)) for index, stem in enumerate(stems))
    results = []
    for index, prob in predictor.probabilities(images):
        truth = _read(load_mask, samples[stems[index]].mask)[0].bool()
        results.append((stems[index], *score_image(prob, truth, tolerance)))
    report = build_report(sorted(results), tolerance, threshold)
    report["source"] = {"checkpoint": str(checkpoint), "data": str(root), "split": split}
    return report


def build_report(results: list[tuple[str, torch.Tensor, torch.Tensor]], tolerance: float, threshold: float) -> dict:
    """The report from per-image (name, strict, tolerant) histograms."""
    strict = torch.stack([r[1] for r in results]).sum(0)
    tolerant = torch.stack([r[2] for r in results]).sum(0)
    operating = scores_at(tolerant, threshold)
    crack_iou = scores_at(strict, threshold).iou
    back_iou = background_iou(strict, threshold)
    ods = best_f1(tolerant)
    ois = optimal_image_scale([r[2] for r in results])
    rows = []
    for name, image_strict, image_tolerant in results:
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


def format_table(report: dict) -> str:
    d, ods, ois = report["dataset"], report["ods"], report["ois"]
    lines = [
        f"{report['images']} images, tolerance {report['tolerance_px']:g} px, operating threshold {report['threshold']:.4g}",
        f"  dataset   precision {d['precision']:.4f}  recall {d['recall']:.4f}  F1 {d['f1']:.4f}",
        f"            IoU crack {d['iou_crack']:.4f}  IoU background {d['iou_background']:.4f}  mIoU {d['miou']:.4f}  (strict pixels)",
        f"  per image mean F1 {report['per_image_mean']['f1']:.4f}  mean IoU {report['per_image_mean']['iou']:.4f}",
        f"  ODS F1 {ods['f1']:.4f} @ {ods['threshold']:.4g}   OIS F1 {ois['f1']:.4f}   AP {report['ap']:.4f}",
        "  worst: " + ", ".join(report["worst_images"][:5]),
    ]
    return "\n".join(lines)


def write_report(report: dict, out: Path) -> None:
    """report.json, report.md, per_image.csv (worst first), pr_curve.csv and pr_curve.png in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {key: value for key, value in report.items() if key not in ("per_image", "pr_curve")}
    write_atomic(out / "report.json", json.dumps({**summary, "pr_curve": report["pr_curve"]}, indent=1) + "\n")
    write_csv(out / "per_image.csv", report["per_image"])
    write_csv(out / "pr_curve.csv", report["pr_curve"])
    _plot_pr_curve(report, out / "pr_curve.png")
    definitions = "\n".join(f"- **{name}**: {text}" for name, text in report["definitions"].items())
    write_atomic(out / "report.md", f"# Crack segmentation report\n\n```\n{format_table(report)}\n```\n\n## Definitions\n\n{definitions}\n")


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
    draw.text((4, 8), f"precision   (AP {report['ap']:.3f}, ODS F1 {report['ods']['f1']:.3f})", fill="black")
    curve = [point(p["recall"], p["precision"]) for p in report["pr_curve"]]
    draw.line(curve, fill=(200, 30, 30), width=2)
    ods = report["ods"]
    x, y = point(ods["recall"], ods["precision"])
    draw.ellipse([x - 4, y - 4, x + 4, y + 4], outline=(30, 30, 200), width=2)
    write_atomic(path, lambda file: image.save(file, "PNG"))

