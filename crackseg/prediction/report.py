"""``report.html``: what an inspection engineer opens, made from a predictions folder.

One self-contained page (no network: styles, script and data are inline; pictures are
files beside it, linked relatively) with the run's summary, a table of images (sortable,
paginated, thumbnails loaded lazily, so thousands of images stay usable), and per image
the photo with its overlay (a toggle) and its crack table with ids and width classes. With
an evaluation folder (``crackseg evaluate --out``), the precision-recall curve and the
worst images too. Pictures are written once under ``report/`` and reused by later reports.
The page's shell (styles, helpers, placeholders) is :mod:`crackseg.core.html`, shared with
compare's change report.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

from PIL import Image

from crackseg.core.errors import InputError
from crackseg.core.files import read_csv, write_atomic
from crackseg.core.html import VIEW_PX, page, relative_url
from crackseg.cracks.measure import find_cracks
from crackseg.cracks.widths import MM_DIGITS
from crackseg.data.images import DECODE_ERRORS, image_pixels
from crackseg.prediction.outputs import REPORT_PICTURES, PredictionsFolder, read_saved_mask
from crackseg.prediction.pictures import overlay_jpeg

THUMB_PX = 192


def write_report(predictions: Path, evaluation: Path | None = None) -> Path:
    """Write ``predictions/report.html`` (and its pictures under ``predictions/report/``); returns its path."""
    for given, made_by in ((predictions, "crackseg predict --out"), (evaluation, "crackseg evaluate --out")):
        if given is not None and not Path(given).is_dir():
            raise InputError(f"{given}: {'not a folder' if Path(given).exists() else 'no such folder'}; give the folder that {made_by} wrote")
    folder = PredictionsFolder(predictions)
    summary = _read_json(folder.summary_json, "run crackseg predict first")
    rows = folder.read_predictions()
    cracks = folder.read_cracks()
    by_image: dict[str, list[dict]] = {}
    for crack in cracks:
        by_image.setdefault(crack["path"], []).append(crack)
    images = [_image_entry(folder, row, number, by_image.get(row["path"], []), summary) for number, row in enumerate(rows, start=1)]
    data = {"summary": summary, "images": images, "evaluation": _evaluation(folder, evaluation) if evaluation else None,
            "mm_digits": MM_DIGITS}
    write_atomic(folder.report_html, page(_PAGE, f"crackseg report: {folder.root.name}", data))
    return folder.report_html


def _image_entry(folder: PredictionsFolder, row: dict, number: int, cracks: list[dict], summary: dict) -> dict:
    """One image's table row (``number``, 1 = the first) and detail, with its pictures written (once) under report/."""
    mask_path = folder.table_path(row["mask"], "mask", number)
    name = folder.name_of(mask_path)
    pictures = _pictures(folder, name, folder.photo(row["path"]), mask_path, summary)
    measured = row.get("cracks") not in (None, "")  # not with --no-measure, nor for a failed image
    in_mm = bool(cracks) and all(crack.get("max_width_mm") not in (None, "") for crack in cracks)
    widest = max(cracks, key=lambda c: float(c["max_width_mm" if in_mm else "max_width_px"]), default=None)
    return {
        "name": name,
        "path": row["path"],
        "cracks": int(row["cracks"]) if measured else None,
        "length_px": float(row.get("length_px") or 0) if measured else None,
        "length_mm": _number(row.get("length_mm")),
        "max_width_px": (float(widest["max_width_px"]) if widest else 0.0) if measured else None,
        "max_width_mm": float(widest["max_width_mm"]) if in_mm and widest else _number(row.get("max_width_mm")),  # 0 crack-free
        "crack_fraction": float(row["crack_fraction"]),
        "status": row.get("status", ""),
        "cracks_table": [{key: crack[key] for key in crack if key != "path"} for crack in cracks],
        **pictures,
    }


def _number(cell: str | None) -> float | None:
    return None if cell in (None, "") else float(cell)


def _pictures(folder: PredictionsFolder, name: str, photo_path: Path, mask_path: Path, summary: dict) -> dict:
    """Thumbnail, photo and overlay as JPEGs under report/, written only when missing or older than the mask."""
    pictures = {kind: folder.report_picture(kind, name) for kind in REPORT_PICTURES}
    names = {kind: relative_url(path.relative_to(folder.root)) for kind, path in pictures.items()}
    if not mask_path.is_file():
        return {}  # removed since prediction: the table still lists the image, as when its photo moved
    fresh = all(path.exists() and path.stat().st_mtime >= mask_path.stat().st_mtime for path in pictures.values())
    if fresh:
        return names
    if mask_path.suffix.lower() == ".tif":
        return {}  # a raster predicted by windows: too large to picture whole; the table still lists it
    try:
        image = image_pixels(photo_path)
    except DECODE_ERRORS:
        return {}  # the photo moved since prediction: the table still lists the image
    overlay = _saved_overlay(folder.overlay(name))
    if overlay is None:
        labels, cracks = find_cracks(read_saved_mask(mask_path), summary.get("join_gap_px", 0.0), summary.get("min_length_px", 0.0))
        overlay = Image.open(io.BytesIO(overlay_jpeg(image, labels > 0, cracks)))
    photo = Image.fromarray(image)
    for kind, picture, side in (("photos", photo, VIEW_PX), ("overlays", overlay, VIEW_PX), ("thumbs", overlay, THUMB_PX)):
        copy = picture.copy()
        copy.thumbnail((side, side))
        write_atomic(pictures[kind], lambda file, copy=copy: copy.save(file, "JPEG", quality=85))
    return names


def _saved_overlay(path: Path) -> Image.Image | None:
    """The overlay predict saved, if it can be read; else the report draws it again from the mask."""
    try:
        with Image.open(path) as picture:
            return picture.convert("RGB")
    except DECODE_ERRORS:  # OSError among them: no saved overlay
        return None


def _evaluation(folder: PredictionsFolder, evaluation: Path) -> dict:
    report = _read_json(evaluation / "report.json", "run crackseg evaluate --out first")
    if report.get("protocol", "crackseg") != "crackseg":
        raise InputError(f"{evaluation}: scored under --protocol {report['protocol']}; the report shows crackseg's own figures: "
                         "give an evaluation made without --protocol")
    curve = folder.report_pictures / "pr_curve.png"
    if (evaluation / "pr_curve.png").exists():
        curve.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(evaluation / "pr_curve.png", curve)
    worst = read_csv(evaluation / "per_image.csv")[:10] if (evaluation / "per_image.csv").exists() else []
    return {
        "dataset": report.get("dataset"), "ods": report.get("ods"), "ois": report.get("ois"), "ap": report.get("ap"),
        "tolerance_px": report.get("tolerance_px"), "pr_curve": relative_url(curve.relative_to(folder.root)) if curve.exists() else None,
        "worst": worst,
    }


def _read_json(path: Path, advice: str) -> dict:
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: not found; {advice}") from None
    except ValueError as error:
        raise InputError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(content, dict):
        raise InputError(f"{path}: not what crackseg writes there (a JSON object); {advice}")
    return content


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
const measured = S.cracks !== undefined, UNMEASURED = "not measured";
const lengthOf = im => mm && im.length_mm !== null ? im.length_mm : im.length_px;  // the sort keys: mm when the page shows mm
const widthOf = im => mm && im.max_width_mm !== null ? im.max_width_mm : im.max_width_px;
const len = im => im.length_px === null ? UNMEASURED : mm && im.length_mm !== null ? num(im.length_mm / 1000, 3) + " m" : num(im.length_px, 0) + " px";
const widthMm = v => num(v, DATA.mm_digits) + " mm";  // as the tables write it and the width classes grade it
const wid = im => im.max_width_px === null ? UNMEASURED : mm && im.max_width_mm !== null ? widthMm(im.max_width_mm) : num(im.max_width_px, 1) + " px";
const value = (im, key) => (key === "length" ? lengthOf(im) : key === "widest" ? widthOf(im) : im[key]) ?? -Infinity;
function card(label, text, id) { return el("div", {class: "card"}, label, el("b", {id: id}, String(text))); }
function summary() {
  const box = document.getElementById("summary");
  box.append(el("div", {class: "cards"},
    card("images", S.images, "sum-images"),
    card("cracks", measured ? S.cracks : UNMEASURED, "sum-cracks"),
    card("total length", !measured ? UNMEASURED : mm && S.length_mm !== undefined ? num(S.length_mm / 1000, 3) + " m" : num(S.length_px, 0) + " px", "sum-length"),
    card("widest crack", !measured ? UNMEASURED : S.widest ? (mm ? widthMm(S.widest.max_width_mm) : num(S.widest.max_width_px, 1) + " px") : "none", "sum-widest")));
  if (S.widest) box.append(el("p", {class: "muted"}, `widest: crack ${S.widest.crack} of ${S.widest.path}`));
  box.append(el("p", {class: "muted", id: "scale"}, scale ? `pixel size ${S.px_size_mm} mm; widths are known to about ±1 px (±${S.px_size_mm} mm)`
    : mm ? "each raster in its own pixel size (px_size_mm in predictions.csv); widths are known to about ±1 px"
    : "no pixel size: lengths and widths in pixels"));
  for (const w of S.warnings || []) box.append(el("p", {class: "warn"}, "warning: " + w));
  const wc = S.width_classes;
  if (wc) {  // a summary written before the standards' presets has no ranges_mm or title
    const range = label => wc.ranges_mm ? [el("td", {}, wc.ranges_mm[label] + " mm")] : [];
    const table = el("table", {id: "classes"}, el("tr", {}, el("th", {}, "class"), ...(wc.ranges_mm ? [el("th", {}, `${wc.by} w`)] : []),
      el("th", {}, "cracks"), el("th", {}, "length")));
    for (const label of wc.labels) table.append(el("tr", {}, el("td", {}, label), ...range(label), el("td", {}, String(wc.cracks[label])),
      el("td", {}, num(wc.length_mm[label] / 1000, 3) + " m")));
    const standard = wc.title ? `${wc.title} (--width-classes ${wc.name})` : `classes at ${wc.edges_mm.join(", ")} mm`;
    box.append(el("h2", {}, "Length by width class"), el("p", {id: "classes-standard"}, `${standard}: each crack is classed by its ${wc.by}`), table);
  }
}
function evaluation() {
  const E = DATA.evaluation; if (!E) return;
  const box = document.getElementById("evaluation");
  box.append(el("h2", {}, "Scores against ground truth"), el("p", {},
    `F1 ${num(E.dataset.f1, 4)} (P ${num(E.dataset.precision, 4)}, R ${num(E.dataset.recall, 4)}) at tolerance ${E.tolerance_px} px; ` +
    `IoU ${num(E.dataset.iou_crack, 4)}; ODS ${num(E.ods.f1, 4)}, OIS ${E.ois.f1 === null ? "n/a" : num(E.ois.f1, 4)}, AP ${E.ap === null ? "n/a" : num(E.ap, 4)}`));
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
      el("td", {}, String(im.cracks ?? UNMEASURED)), el("td", {}, len(im)), el("td", {}, wid(im)), el("td", {}, num(100 * im.crack_fraction, 2) + " %"));
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
