"""``report.html``: what an inspection engineer opens, made from a predictions folder.

One self-contained page (no network: styles, script and data are inline; pictures are
files beside it, linked relatively) with the run's summary, a table of images (sortable,
paginated, thumbnails loaded lazily, so thousands of images stay usable), and per image
the photo with its overlay (a toggle) and its crack table with ids and width classes. With
an evaluation folder (``crackseg evaluate --out``), the precision-recall curve and the
worst images too. Pictures are written once under ``report/`` and reused by later reports.

``crackseg compare`` gets its own page from the same parts: per pair of inspections its
registration, the before and after pictures with each crack tinted in its change status's
colour (:func:`change_picture`), and its changes sortable by growth. It is given plain rows
(this module sits above the comparison modules), never their objects.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import re
import shutil
import urllib.parse
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from crackseg.errors import InputError
from crackseg.files import cell_number, write_atomic
from crackseg.images import DECODE_ERRORS, image_pixels
from crackseg.measure import find_cracks
from crackseg.outputs import PredictionsFolder, overlay_jpeg, read_saved_mask

THUMB_PX, VIEW_PX = 192, 1600
PAGE_ROWS = 50
CHANGE_ROWS = 20  # rows of a pair's change table per page: thousands of changes stay usable
# Change statuses of crackseg compare: hues told apart with the common colour-vision deficiencies where
# possible (the Okabe-Ito orange, vermillion and blue), with lightness to separate the rest.
STATUS_COLOURS: dict[str, tuple[int, int, int]] = {
    "unchanged": (150, 150, 150),
    "not seen": (205, 205, 205),
    "shorter": (86, 180, 233),
    "longer": (230, 159, 0),
    "wider": (213, 94, 0),
    "longer+wider": (170, 0, 20),
    "new": (230, 0, 200),
    "gone": (0, 114, 178),
    "merged": (110, 50, 160),
    "split": (180, 130, 230),
}
_SIDES = ("before", "after")
_UNPAIRED = ("only before", "only after")  # pairs.csv statuses of an image found in one inspection only: no section
# (every other pair has one: registered with its changes, or unregistered / failed with its reason)


def write_report(predictions: Path, evaluation: Path | None = None) -> Path:
    """Write ``predictions/report.html`` (and its pictures under ``predictions/report/``); returns its path."""
    folder = PredictionsFolder(predictions)
    summary = _read_json(folder.summary_json, "run crackseg predict first")
    rows = _read_csv(folder.predictions_csv)
    cracks = _read_csv(folder.cracks_csv) if folder.cracks_csv.exists() else []
    by_image: dict[str, list[dict]] = {}
    for crack in cracks:
        by_image.setdefault(crack["path"], []).append(crack)
    images = [_image_entry(folder, row, by_image.get(row["path"], []), summary) for row in rows]
    data = {"summary": summary, "images": images, "evaluation": _evaluation(folder, evaluation) if evaluation else None}
    write_atomic(folder.report_html, _page(_PAGE, f"crackseg report: {folder.root.name}", data))
    return folder.report_html


def _image_entry(folder: PredictionsFolder, row: dict, cracks: list[dict], summary: dict) -> dict:
    """One image's table row and detail, with its pictures written (once) under report/."""
    mask_path = Path(row["mask"])
    name = folder.name_of(mask_path)
    pictures = _pictures(folder, name, Path(row["path"]), mask_path, summary)
    widest = max(cracks, key=lambda c: float(c["max_width_px"]), default=None)
    return {
        "name": name,
        "path": row["path"],
        "cracks": int(row.get("cracks") or 0),
        "length_px": float(row.get("length_px") or 0),
        "length_mm": float(row["length_mm"]) if row.get("length_mm") not in (None, "") else None,
        "max_width_px": float(widest["max_width_px"]) if widest else 0.0,
        "max_width_mm": float(widest["max_width_mm"]) if widest and widest.get("max_width_mm") else None,
        "crack_fraction": float(row["crack_fraction"]),
        "status": row.get("status", ""),
        "cracks_table": [{key: crack[key] for key in crack if key != "path"} for crack in cracks],
        **pictures,
    }


def _pictures(folder: PredictionsFolder, name: str, photo_path: Path, mask_path: Path, summary: dict) -> dict:
    """Thumbnail, photo and overlay as JPEGs under report/, written only when missing or older than the mask."""
    pictures = {kind: folder.report_pictures / kind / f"{name}.jpg" for kind in ("thumbs", "photos", "overlays")}
    names = {kind: _url(path.relative_to(folder.root)) for kind, path in pictures.items()}
    fresh = all(path.exists() and path.stat().st_mtime >= mask_path.stat().st_mtime for path in pictures.values())
    if fresh:
        return names
    if mask_path.suffix.lower() == ".tif":
        return {}  # a raster predicted by windows: too large to picture whole; the table still lists it
    try:
        image = image_pixels(photo_path)
    except DECODE_ERRORS:
        return {}  # the photo moved since prediction: the table still lists the image
    saved_overlay = folder.overlay(name)
    if saved_overlay.exists():
        overlay = Image.open(saved_overlay).convert("RGB")
    else:
        labels, cracks = find_cracks(read_saved_mask(mask_path), summary.get("join_gap_px", 0.0), summary.get("min_length_px", 0.0))
        overlay = Image.open(io.BytesIO(overlay_jpeg(image, labels > 0, cracks)))
    photo = Image.fromarray(image)
    for kind, picture, side in (("photos", photo, VIEW_PX), ("overlays", overlay, VIEW_PX), ("thumbs", overlay, THUMB_PX)):
        copy = picture.copy()
        copy.thumbnail((side, side))
        write_atomic(pictures[kind], lambda file, copy=copy: copy.save(file, "JPEG", quality=85))
    return names


def _url(relative: Path) -> str:
    """A relative URL of a picture whatever its name holds (#, ?, %, backslashes, newlines, bytes that are not UTF-8)."""
    return urllib.parse.quote(os.fsencode(relative.as_posix()))


def _evaluation(folder: PredictionsFolder, evaluation: Path) -> dict:
    report = _read_json(evaluation / "report.json", "run crackseg evaluate --out first")
    if report.get("protocol", "crackseg") != "crackseg":
        raise InputError(f"{evaluation}: scored under --protocol {report['protocol']}; the report shows crackseg's own figures: "
                         "give an evaluation made without --protocol")
    curve = folder.report_pictures / "pr_curve.png"
    if (evaluation / "pr_curve.png").exists():
        curve.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(evaluation / "pr_curve.png", curve)
    worst = _read_csv(evaluation / "per_image.csv")[:10] if (evaluation / "per_image.csv").exists() else []
    return {
        "dataset": report.get("dataset"), "ods": report.get("ods"), "ois": report.get("ois"), "ap": report.get("ap"),
        "tolerance_px": report.get("tolerance_px"), "pr_curve": _url(curve.relative_to(folder.root)) if curve.exists() else None,
        "worst": worst,
    }


def _read_json(path: Path, advice: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: not found; {advice}") from None
    except ValueError as error:
        raise InputError(f"{path}: not readable JSON ({error})") from None


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        raise InputError(f"{path}: not found; run crackseg predict first")
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def change_picture(photo: np.ndarray, labels: np.ndarray, statuses: dict[int, str], max_side: int = VIEW_PX) -> bytes:
    """A JPEG for people: ``photo`` ((H, W, 3) uint8) reduced so its longer side is at most ``max_side``,
    each crack of ``labels`` ((H, W) int ids, 0 = background) that has a status tinted in its
    :data:`STATUS_COLOURS` colour and labelled with its id; cracks without a status are left as photographed.

    Crack pixels are max-pooled onto the reduced grid, so a crack 1 px wide stays visible; where cracks
    of two statuses share a reduced pixel, the status listed later in STATUS_COLOURS shows.
    """
    height, width = labels.shape
    scale = min(1.0, max_side / max(height, width))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    picture = Image.fromarray(photo)
    if size != picture.size:
        picture = picture.resize(size, Image.Resampling.LANCZOS)
    names = list(STATUS_COLOURS)
    codes = np.zeros(int(labels.max(initial=0)) + 1, np.uint8)  # label -> 1 + its status's place in STATUS_COLOURS
    for crack, status in statuses.items():
        if 0 < crack < len(codes):
            codes[crack] = names.index(status) + 1
    rows, cols = np.nonzero(codes[labels])
    pooled = np.zeros((size[1], size[0]), np.uint8)
    np.maximum.at(pooled, (rows * size[1] // height, cols * size[0] // width), codes[labels[rows, cols]])
    tinted = np.asarray(picture, np.float32).copy()
    colours = np.array([(0, 0, 0), *STATUS_COLOURS.values()], np.float32)
    crack_pixels = pooled > 0
    tinted[crack_pixels] = 0.35 * tinted[crack_pixels] + 0.65 * colours[pooled[crack_pixels]]
    picture = Image.fromarray(tinted.round().astype(np.uint8))
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=max(10, min(picture.size) // 40))
    for crack, (row, col) in _middle_pixels(labels[rows, cols], rows, cols).items():
        at = (col * size[0] // width + 3, row * size[1] // height + 3)
        box = draw.textbbox(at, str(crack), font=font)
        draw.rectangle((box[0] - 2, box[1] - 1, box[2] + 2, box[3] + 1), fill=(255, 255, 255))
        colour = tuple(int(0.6 * value) for value in STATUS_COLOURS[statuses[crack]])  # darker: legible on white
        draw.text(at, str(crack), fill=colour, font=font)
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=90, subsampling=0)  # full-resolution colour: thin tinted cracks keep their hue
    return buffer.getvalue()


def _middle_pixels(owners: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> dict[int, tuple[int, int]]:
    """Per crack id, the middle one of its pixels in scan order (a pixel on the crack): where to write its id."""
    order = np.argsort(owners, kind="stable")
    owners, ids = owners[order], np.unique(owners)
    middles = (np.searchsorted(owners, ids) + np.searchsorted(owners, ids, side="right")) // 2
    return {int(crack): (int(rows[order[m]]), int(cols[order[m]])) for crack, m in zip(ids, middles)}


def write_change_report(out: Path, summary: dict, pairs: list[dict], changes: list[dict]) -> Path:
    """``out/report.html`` of ``crackseg compare``, one offline page like the predictions report; returns its path.

    ``pairs``: rows of pairs.csv, each with ``pair`` (its index) and ``picture_before`` /
    ``picture_after`` (JPEG paths relative to ``out``, or None); ``changes``: rows of changes.csv,
    each with ``pair``. Of ``summary`` only ``before``, ``after`` (the two inspections) and
    ``warnings`` are shown, all optional: the figures come from the rows. Lengths and widths are
    in mm where a pair's rows have them, else in px.
    """
    by_pair: dict[int, list[dict]] = {}
    for change in changes:
        by_pair.setdefault(int(change["pair"]), []).append(change)
    entries = [_pair_entry(pair, by_pair.get(int(pair["pair"]), [])) for pair in pairs]
    compared = [entry for entry in entries if entry["status"] == "registered"]
    measured = [entry for entry in compared if entry["changes"]]  # a pair without cracks has no unit to give
    unit = "mm" if measured and all(entry["unit"] == "mm" for entry in measured) else "px"
    counts = Counter(change["status"] for change in changes)
    data = {
        "summary": {
            "before": str(summary.get("before") or ""), "after": str(summary.get("after") or ""),
            "warnings": [str(warning) for warning in summary.get("warnings", [])],
            "compared": len(compared), "unregistered": sum(entry["section"] and entry["status"] != "registered" for entry in entries),
            "unpaired": sum(not entry["section"] for entry in entries),
            "statuses": {status: counts[status] for status in [*STATUS_COLOURS, *sorted(set(counts) - set(STATUS_COLOURS))]},
            "unit": unit,
            **{f"length_{side}": sum(_total_length(by_pair.get(entry["index"], []), side, unit) for entry in compared)
               for side in _SIDES},
        },
        "colours": {status: "rgb({}, {}, {})".format(*colour) for status, colour in STATUS_COLOURS.items()},
        "pairs": entries,
    }
    names = [Path(str(summary[key])).name for key in _SIDES if summary.get(key)]
    title = f"crackseg compare: {' → '.join(names) if len(names) == 2 else Path(out).name}"
    report = Path(out) / "report.html"
    write_atomic(report, _page(_CHANGE_PAGE, title, data))
    return report


def _pair_entry(pair: dict, rows: list[dict]) -> dict:
    """One pair's row of the pairs table and its section: registration, picture URLs, changes in its unit."""
    unit = "mm" if any(cell_number(row.get(f"length_mm_{side}")) is not None for row in rows for side in _SIDES) else "px"
    changes = [_change_entry(row, unit) for row in rows]
    lengths = {side: _total_length(rows, side, unit) for side in _SIDES}
    inliers = cell_number(pair.get("inliers"))
    return {
        "index": int(pair["pair"]), "name_before": str(pair.get("name_before") or ""), "name_after": str(pair.get("name_after") or ""),
        "status": str(pair["status"]), "section": pair["status"] not in _UNPAIRED,
        "method": str(pair.get("method") or ""), "reason": str(pair.get("reason") or ""),
        "inliers": None if inliers is None else int(inliers), "residual_px": cell_number(pair.get("residual_px")),
        **{f"picture_{side}": _url(Path(pair[f"picture_{side}"])) if pair.get(f"picture_{side}") else None for side in _SIDES},
        "unit": unit, "changes": changes,
        "changed": sum(change["status"] not in ("unchanged", "not seen") for change in changes),
        "new": sum(change["status"] == "new" for change in changes), "gone": sum(change["status"] == "gone" for change in changes),
        "length_growth": lengths["after"] - lengths["before"] if pair["status"] == "registered" else None,
    }


def _change_entry(row: dict, unit: str) -> dict:
    """One row of a pair's change table. Growth is the row's own (compare writes it in the AFTER image's pixels,
    BEFORE sizes through the registration's scale, and a merged or split group's as a whole), else
    after - before, a missing side counting 0 (new: its whole length; gone: minus it)."""
    entry = {"status": str(row["status"]), "class_changed": str(row.get("class_changed", "")).lower() in ("true", "1", "yes")}
    for side in _SIDES:
        entry[side] = int(row[f"crack_{side}"]) if row.get(f"crack_{side}") not in (None, "") else None
        entry[f"class_{side}"] = str(row.get(f"max_width_class_{side}") or "")
        for measure in ("length", "max_width"):
            entry[f"{measure}_{side}"] = cell_number(row.get(f"{measure}_{unit}_{side}"))
    for measure in ("length", "max_width"):
        given = cell_number(row.get(f"{measure}_growth_{unit}"))
        entry[f"{measure}_growth"] = given if given is not None else (entry[f"{measure}_after"] or 0.0) - (entry[f"{measure}_before"] or 0.0)
    return entry


def _total_length(rows: list[dict], side: str, unit: str) -> float:
    """The length of one side's cracks in a pair, each counted once (a merged or split crack is in several rows)."""
    lengths = {row[f"crack_{side}"]: cell_number(row.get(f"length_{unit}_{side}")) or 0.0
               for row in rows if row.get(f"crack_{side}") not in (None, "")}
    return sum(lengths.values())


def _page(template: str, title: str, data: dict) -> str:
    """``template`` with its placeholders filled in one pass, so text from the data is never read as a placeholder."""
    values = {
        "/*STYLE*/": _STYLE, "/*HELPERS*/": _HELPERS, "/*ROWS*/": str(PAGE_ROWS), "/*CHANGE_ROWS*/": str(CHANGE_ROWS),
        "<!--TITLE-->": html.escape(title),
        # Every "<" escaped: "</script>" or "<!--" in a file name must not end or hide the script holding the data.
        "/*DATA*/": json.dumps(data).replace("<", "\\u003c"),
    }
    return re.sub("|".join(map(re.escape, values)), lambda match: values[match.group(0)], template)


_STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:0 24px 40px;color:#222}
h1{font-size:22px;margin:18px 0 6px}h2{font-size:17px;margin:22px 0 8px}
table{border-collapse:collapse}th,td{padding:4px 8px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}th.sortable{cursor:pointer;user-select:none;background:#f3f3f3}
th.sortable:hover{background:#e6e6e6}tr.image-row{cursor:pointer}tr.image-row:hover{background:#fff5e6}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:130px}
.card b{display:block;font-size:20px}.muted{color:#777}.warn{color:#a15c00}
img.thumb{height:48px;border:1px solid #ccc}#detail{margin-top:18px;border-top:2px solid #c33;padding-top:8px}
#detail img{max-width:100%;border:1px solid #ccc}button{font:inherit;padding:3px 10px;margin-right:6px}
"""

_HELPERS = r'''const el = (tag, attrs, ...children) => { const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child); return node; };
const num = (v, d) => (v === null || v === undefined || Number.isNaN(v)) ? "" : Number(v).toFixed(d);
'''


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title><!--TITLE--></title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>/*STYLE*/</style></head><body>
<h1><!--TITLE--></h1>
<section id="summary"></section>
<section id="evaluation"></section>
<h2>Images</h2>
<div id="pager"></div>
<table id="images"><thead><tr>
<th class="sortable" data-key="name">image</th><th>overlay</th><th class="sortable" data-key="cracks">cracks</th>
<th class="sortable" data-key="length">length</th><th class="sortable" data-key="widest">widest crack</th>
<th class="sortable" data-key="crack_fraction">crack pixels</th></tr></thead><tbody></tbody></table>
<section id="detail"></section>
<script>
"use strict";
const DATA = /*DATA*/;
const PAGE_ROWS = /*ROWS*/;
const S = DATA.summary, scale = S.px_size_mm !== null && S.px_size_mm !== undefined;
const mm = scale || (S.length_mm !== null && S.length_mm !== undefined);  // rasters measured each in its own scale
let sortKey = "name", sortDown = false, page = 0;
/*HELPERS*/
const len = im => mm && im.length_mm !== null ? num(im.length_mm / 1000, 3) + " m" : num(im.length_px, 0) + " px";
const wid = im => mm && im.max_width_mm !== null ? num(im.max_width_mm, 2) + " mm" : num(im.max_width_px, 1) + " px";
const value = (im, key) => key === "length" ? im.length_px : key === "widest" ? im.max_width_px : im[key];
function card(label, text, id) { return el("div", {class: "card"}, label, el("b", {id: id}, String(text))); }
function summary() {
  const box = document.getElementById("summary");
  box.append(el("div", {class: "cards"},
    card("images", S.images, "sum-images"),
    card("cracks", S.cracks ?? "not measured", "sum-cracks"),
    card("total length", mm && S.length_mm !== undefined ? num(S.length_mm / 1000, 3) + " m" : num(S.length_px, 0) + " px", "sum-length"),
    card("widest crack", S.widest ? (mm ? num(S.widest.max_width_mm, 2) + " mm" : num(S.widest.max_width_px, 1) + " px") : "none", "sum-widest")));
  if (S.widest) box.append(el("p", {class: "muted"}, `widest: crack ${S.widest.crack} of ${S.widest.path}`));
  box.append(el("p", {class: "muted", id: "scale"}, scale ? `pixel size ${S.px_size_mm} mm; widths are known to about ±1 px (±${S.px_size_mm} mm)`
    : mm ? "each raster in its own pixel size (px_size_mm in predictions.csv); widths are known to about ±1 px"
    : "no pixel size: lengths and widths in pixels"));
  for (const w of S.warnings || []) box.append(el("p", {class: "warn"}, "warning: " + w));
  const wc = S.width_classes;
  if (wc) {
    const table = el("table", {id: "classes"}, el("tr", {}, el("th", {}, `width class (${wc.name}, by ${wc.by})`), el("th", {}, "cracks"), el("th", {}, "length")));
    for (const label of wc.labels) table.append(el("tr", {}, el("td", {}, label), el("td", {}, String(wc.cracks[label])), el("td", {}, num(wc.length_mm[label] / 1000, 3) + " m")));
    box.append(el("h2", {}, "Length by width class"), table);
  }
}
function evaluation() {
  const E = DATA.evaluation; if (!E) return;
  const box = document.getElementById("evaluation");
  box.append(el("h2", {}, "Scores against ground truth"), el("p", {},
    `F1 ${num(E.dataset.f1, 4)} (P ${num(E.dataset.precision, 4)}, R ${num(E.dataset.recall, 4)}) at tolerance ${E.tolerance_px} px; ` +
    `IoU ${num(E.dataset.iou_crack, 4)}; ODS ${num(E.ods.f1, 4)}, OIS ${num(E.ois.f1, 4)}, AP ${num(E.ap, 4)}`));
  if (E.pr_curve) box.append(el("img", {src: E.pr_curve, alt: "precision-recall curve", id: "pr-curve"}));
  if (E.worst.length) { const list = el("ol", {id: "worst"});
    for (const w of E.worst) list.append(el("li", {}, `${w.image}: F1 ${num(Number(w.f1), 3)}, IoU ${num(Number(w.iou), 3)}`));
    box.append(el("h2", {}, "Worst images"), list); }
}
function sorted() {
  const rows = DATA.images.slice();
  rows.sort((a, b) => { const x = value(a, sortKey), y = value(b, sortKey);
    const c = typeof x === "string" ? x.localeCompare(y) : x - y; return sortDown ? -c : c; });
  return rows;
}
function render() {
  const rows = sorted(), pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  page = Math.min(page, pages - 1);
  const body = document.querySelector("#images tbody"); body.replaceChildren();
  for (const im of rows.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS)) {
    const tr = el("tr", {class: "image-row", "data-name": im.name},
      el("td", {}, im.name), el("td", {}, im.thumbs ? el("img", {class: "thumb", loading: "lazy", src: im.thumbs, alt: ""}) : "—"),
      el("td", {}, String(im.cracks)), el("td", {}, len(im)), el("td", {}, wid(im)), el("td", {}, num(100 * im.crack_fraction, 2) + " %"));
    tr.addEventListener("click", () => detail(im)); body.append(tr);
  }
  const pager = document.getElementById("pager"); pager.replaceChildren();
  const prev = el("button", {id: "prev"}, "previous"), next = el("button", {id: "next"}, "next");
  prev.disabled = page === 0; next.disabled = page >= pages - 1;
  prev.addEventListener("click", () => { page -= 1; render(); }); next.addEventListener("click", () => { page += 1; render(); });
  pager.append(prev, next, `page ${page + 1} of ${pages} (${rows.length} images)`);
}
function detail(im) {
  const box = document.getElementById("detail"); box.replaceChildren(el("h2", {}, im.name), el("p", {class: "muted"}, im.path));
  if (im.photos) {
    const picture = el("img", {id: "view", src: im.overlays, alt: im.name, "data-showing": "overlay"});
    const toggle = el("button", {id: "toggle"}, "show photo");
    toggle.addEventListener("click", () => { const overlay = picture.dataset.showing === "overlay";
      picture.src = overlay ? im.photos : im.overlays; picture.dataset.showing = overlay ? "photo" : "overlay";
      toggle.textContent = overlay ? "show overlay" : "show photo"; });
    box.append(el("p", {}, toggle), picture);
  } else box.append(el("p", {class: "warn"}, "photo not found where it was predicted from"));
  if (im.cracks_table.length) {
    const keys = Object.keys(im.cracks_table[0]);
    const table = el("table", {id: "cracks"}, el("tr", {}, ...keys.map(k => el("th", {}, k))));
    for (const crack of im.cracks_table) table.append(el("tr", {}, ...keys.map(k => el("td", {}, String(crack[k])))));
    box.append(el("h2", {}, `${im.cracks_table.length} cracks`), table);
  }
  box.scrollIntoView();
}
for (const th of document.querySelectorAll("th.sortable")) th.addEventListener("click", () => {
  sortDown = sortKey === th.dataset.key ? !sortDown : th.dataset.key !== "name"; sortKey = th.dataset.key; page = 0; render(); });
summary(); evaluation(); render();
</script></body></html>
"""


_CHANGE_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title><!--TITLE--></title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>/*STYLE*/
.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;padding:0;margin:8px 0;list-style:none}
.pictures{display:flex;flex-wrap:wrap;gap:12px}.pictures figure{margin:0;flex:1 1 420px;min-width:0}
.pictures img{max-width:100%;border:1px solid #ccc}section.pair{margin-top:26px;border-top:2px solid #c33}
th[aria-sort=descending]::after{content:" \25BC"}th[aria-sort=ascending]::after{content:" \25B2"}
.pager{margin:6px 0}th.text,td.text{text-align:left}td.changed{font-weight:bold}
</style></head><body>
<h1><!--TITLE--></h1>
<section id="summary"></section>
<h2>Pairs</h2>
<div id="pairs"></div>
<div id="sections"></div>
<script>
"use strict";
const DATA = /*DATA*/;
const PAGE_ROWS = /*ROWS*/, CHANGE_ROWS = /*CHANGE_ROWS*/;
/*HELPERS*/
const S = DATA.summary, COLOURS = DATA.colours;
const missing = v => v === null || v === undefined;
const swatch = status => el("span", {class: "swatch", style: `background:${COLOURS[status] || "#000"}`});
const size = (v, unit, d) => missing(v) ? "" : num(v, d) + " " + unit;
const growth = (v, unit, d) => missing(v) ? "" : (v > 0 ? "+" : "") + size(v, unit, d);
const metres = (v, unit) => unit === "mm" ? num(v / 1000, 3) + " m" : num(v, 0) + " px";
function card(label, text, id, ...extra) { return el("div", {class: "card"}, ...extra, label, el("b", {id: id}, String(text))); }
function summary() {
  const box = document.getElementById("summary");
  if (S.before) box.append(el("p", {class: "muted", id: "inspections"}, `before: ${S.before}; after: ${S.after}`));
  box.append(el("div", {class: "cards"},
    card("pairs compared", S.compared, "sum-compared"), card("unregistered pairs", S.unregistered, "sum-unregistered"),
    card("in one inspection only", S.unpaired, "sum-unpaired"),
    card("length before", metres(S.length_before, S.unit), "sum-length-before"), card("length after", metres(S.length_after, S.unit), "sum-length-after")));
  box.append(el("h2", {}, "Cracks by change"), el("div", {class: "cards", id: "status-cards"},
    ...Object.entries(S.statuses).map(([status, n]) => card(status, n, `sum-${status}`, swatch(status)))));
  for (const w of S.warnings) box.append(el("p", {class: "warn"}, "warning: " + w));
}
// A table sorted by a click on a header (numbers largest first, then a second click reverses; blanks stay last),
// paginated so that thousands of rows stay usable. column: {key, label, text (sorts A-Z first), cell(row)}.
function sortableTable({id, columns, rows, key, down, rowsPerPage, rowAttrs}) {
  let page = 0;
  const heads = columns.map(c => el("th", {class: c.text ? "sortable text" : "sortable", "data-key": c.key}, c.label));
  const body = el("tbody"), pager = el("div", {class: "pager"});
  const order = (a, b) => { const x = a[key], y = b[key];
    if (missing(x) || missing(y)) return missing(x) - missing(y);
    const c = typeof x === "string" ? x.localeCompare(y) : x - y; return down ? -c : c; };
  function render() {
    const sorted = rows.slice().sort(order), pages = Math.max(1, Math.ceil(sorted.length / rowsPerPage));
    page = Math.min(page, pages - 1);
    body.replaceChildren(...sorted.slice(page * rowsPerPage, (page + 1) * rowsPerPage).map(row =>
      el("tr", rowAttrs(row), ...columns.map(c => el("td", {class: [c.text && "text", c.changed && c.changed(row) && "changed"].filter(Boolean).join(" ")},
        c.cell(row))))));
    heads.forEach((th, i) => th.setAttribute("aria-sort", columns[i].key === key ? (down ? "descending" : "ascending") : "none"));
    pager.replaceChildren();
    if (pages > 1) {
      const prev = el("button", {class: "prev"}, "previous"), next = el("button", {class: "next"}, "next");
      prev.disabled = page === 0; next.disabled = page >= pages - 1;
      prev.addEventListener("click", () => { page -= 1; render(); }); next.addEventListener("click", () => { page += 1; render(); });
      pager.append(prev, next, `page ${page + 1} of ${pages} (${sorted.length} rows)`);
    }
  }
  heads.forEach((th, i) => th.addEventListener("click", () => {
    const c = columns[i]; down = key === c.key ? !down : !c.text; key = c.key; page = 0; render(); }));
  render();
  return el("div", {}, pager, el("table", {id: id}, el("thead", {}, el("tr", {}, ...heads)), body));
}
const text = (key, label, cell) => ({key, label, text: true, cell: cell || (row => row[key])});
const number = (key, label, cell) => ({key, label, cell: cell || (row => missing(row[key]) ? "" : String(row[key]))});
function pairs() {
  const name = side => p => p.section ? el("a", {href: `#pair-${p.index}`}, p[`name_${side}`]) : p[`name_${side}`];
  const columns = [number("index", "#"), text("name_before", "before", name("before")), text("name_after", "after", name("after")),
    text("status", "status"), text("method", "method"), number("inliers", "inliers"),
    number("residual_px", "residual", p => size(p.residual_px, "px", 2)), number("changed", "changed cracks"),
    number("new", "new"), number("gone", "gone"), number("length_growth", "length growth", p => growth(p.length_growth, p.unit, p.unit === "mm" ? 1 : 0))];
  document.getElementById("pairs").append(sortableTable({id: "pairs-table", columns, rows: DATA.pairs, key: "index", down: false,
    rowsPerPage: PAGE_ROWS, rowAttrs: p => ({class: "pair-row", "data-pair": p.index})}));
}
function registration(p) {
  if (p.status !== "registered") return `not compared: ${p.status}` + (p.reason ? ` (${p.reason})` : "");
  return `registered by ${p.method || "?"}` + (missing(p.inliers) ? "" : `, ${p.inliers} inliers`) +
    (missing(p.residual_px) ? "" : `, residual ${num(p.residual_px, 2)} px`);
}
function figure(url, side, name) {
  return el("figure", {}, url ? el("img", {src: url, alt: `${side}: ${name}`, loading: "lazy", class: `picture-${side}`})
    : el("p", {class: "muted"}, "no picture"), el("figcaption", {class: "muted"}, `${side}: ${name}`));
}
function legend() {
  return el("ul", {class: "legend"}, ...Object.keys(COLOURS).map(status => el("li", {}, swatch(status), status)));
}
function changes(p) {
  const u = p.unit, d = u === "mm" ? 1 : 0, w = u === "mm" ? 2 : 1;
  const columns = [text("status", "change", c => el("span", {}, swatch(c.status), c.status)),
    number("before", "crack before"), number("after", "crack after"),
    number("length_before", "length before", c => size(c.length_before, u, d)), number("length_after", "length after", c => size(c.length_after, u, d)),
    number("length_growth", "length growth", c => growth(c.length_growth, u, d)),
    number("max_width_before", "max width before", c => size(c.max_width_before, u, w)),
    number("max_width_after", "max width after", c => size(c.max_width_after, u, w)),
    number("max_width_growth", "width growth", c => growth(c.max_width_growth, u, w))];
  if (p.changes.some(c => c.class_before || c.class_after))
    columns.push({...text("class_after", "width class", c => c.class_before === c.class_after ? c.class_after : `${c.class_before || "–"} → ${c.class_after || "–"}`),
      changed: c => c.class_changed});
  return sortableTable({id: `changes-${p.index}`, columns, rows: p.changes, key: "length_growth", down: true, rowsPerPage: CHANGE_ROWS,
    rowAttrs: c => ({class: "change-row", "data-status": c.status, "data-before": c.before ?? "", "data-after": c.after ?? ""})});
}
function sections() {
  const box = document.getElementById("sections");
  for (const p of DATA.pairs) {
    if (!p.section) continue;  // an image of one inspection only: nothing to compare
    const section = el("section", {class: "pair", id: `pair-${p.index}`}, el("h2", {}, `${p.name_before} → ${p.name_after}`),
      el("p", {class: p.status === "registered" ? "registration" : "registration warn"}, registration(p)),
      el("div", {class: "pictures"}, figure(p.picture_before, "before", p.name_before), figure(p.picture_after, "after", p.name_after)));
    if (p.status === "registered") section.append(legend(), p.changes.length ? changes(p) : el("p", {class: "muted"}, "no cracks in either picture"));
    box.append(section);
  }
}
summary(); pairs(); sections();
</script></body></html>
"""
