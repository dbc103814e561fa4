"""An evaluation report: the table printed, and the files of ``--out`` (report.json, report.md, per_image.csv, the
precision-recall curve)."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

from crackseg.core.errors import InputError
from crackseg.core.files import write_atomic, write_csv
from crackseg.core.staging import StagedFolder
from crackseg.evaluation.false_alarms import format_alarms
from crackseg.evaluation.protocols import PROTOCOLS


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
        f"  ODS F1 {ods['f1']:.4f} @ {ods['threshold']:.4g}   OIS F1 {_figure(ois['f1'], 4)}   AP {_figure(report['ap'], 4)}",
    ]


def _figure(value: float | None, digits: int) -> str:
    return "n/a (no true crack pixel)" if value is None else f"{value:.{digits}f}"


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
if set(_TABLES) != set(PROTOCOLS):  # protocols.PROTOCOLS names them, these tables print them
    raise ImportError("crackseg.evaluation.report's tables and crackseg.evaluation.protocols.PROTOCOLS disagree")




_CURVE = ("pr_curve.csv", "pr_curve.png")
REPORT_FILES = ("report.json", "report.md", "per_image.csv", *_CURVE)  # any of them is replaced only on --overwrite


def prepare_report_folder(out: StagedFolder, overwrite: bool) -> None:
    """Before any work: ``out`` prepared (a local folder that can be written, or an s3:// prefix: a missing bucket or a
    refused request stops here), holding no file of a report unless ``overwrite``; a curve there is the run's to keep or
    remove."""
    out.prepare(lambda key: key in _CURVE)
    existing = [name for name in REPORT_FILES if out.existed(out.root / name)]
    if existing and not overwrite:
        out.release()
        raise InputError(f"{out.shown(out.root / existing[0])} already exists; choose another --out or pass --overwrite")


def write_report(report: dict, out: Path) -> None:
    """report.json, report.md, per_image.csv (worst first) in ``out``; pr_curve.csv and pr_curve.png where the
    protocol has a precision-recall curve (a curve left from another protocol is removed)."""
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
        for name in _CURVE:
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
    scores = (f"AP {_figure(report['ap'], 3)}, " if "ap" in report else "") + f"ODS F1 {report['ods']['f1']:.3f}"
    draw.text((4, 8), f"precision   ({scores})", fill="black")
    curve = [point(p["recall"], p["precision"]) for p in report["pr_curve"]]
    draw.line(curve, fill=(200, 30, 30), width=2)
    ods = report["ods"]
    if "recall" in ods:  # a point of the curve (scsegamba's ODS is a mean of per-image F1, on no curve)
        x, y = point(ods["recall"], ods["precision"])
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], outline=(30, 30, 200), width=2)
    write_atomic(path, lambda file: image.save(file, "PNG"))

