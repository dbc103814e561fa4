"""compare's ``report.html``: one offline page like the predictions report (:mod:`crackseg.core.html`).

Per pair of inspections its registration, the before and after pictures with each crack tinted in its
change status's colour (:func:`change_picture`), and its changes sortable by growth. It is given the rows
of pairs.csv and changes.csv, never compare's objects.
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from crackseg.core.files import cell_number, write_atomic
from crackseg.core.html import VIEW_PX, page, relative_url
from crackseg.monitoring.changes import (
    GONE,
    LONGER,
    LONGER_WIDER,
    MERGED,
    NEW,
    NOT_SEEN,
    SHORTER,
    SPLIT,
    STATUSES,
    UNCHANGED,
    WIDER,
)

CHANGE_ROWS = 20  # rows of a pair's change table per page: thousands of changes stay usable
# Each change status's colour, in the order the page lists them and paints them (a later one covers an earlier one):
# hues told apart with the common colour-vision deficiencies where possible (the Okabe-Ito orange, vermillion and
# blue), with lightness to separate the rest.
STATUS_COLOURS: dict[str, tuple[int, int, int]] = {
    UNCHANGED: (150, 150, 150),
    NOT_SEEN: (205, 205, 205),
    SHORTER: (86, 180, 233),
    LONGER: (230, 159, 0),
    WIDER: (213, 94, 0),
    LONGER_WIDER: (170, 0, 20),
    NEW: (230, 0, 200),
    GONE: (0, 114, 178),
    MERGED: (110, 50, 160),
    SPLIT: (180, 130, 230),
}
if sorted(STATUS_COLOURS) != sorted(STATUSES):  # a status added to changes.STATUSES needs its colour here
    raise RuntimeError(f"STATUS_COLOURS and changes.STATUSES differ in {sorted(set(STATUS_COLOURS) ^ set(STATUSES))}")

_SIDES = ("before", "after")
_UNPAIRED = ("only before", "only after")  # pairs.csv statuses of an image found in one inspection only: no section
# (every other pair has one: registered with its changes, or unregistered / failed with its reason)


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
    each with ``pair``. Of ``summary`` only ``before``, ``after`` (the two inspections),
    ``warnings`` and ``width_classes`` (the standard, and the width it grades, whose class columns
    are read: ``max_width_class_*`` without it) are used, all optional: the figures come from the
    rows. Lengths and widths are in mm where a pair's rows have them, else in px.
    """
    by_pair: dict[int, list[dict]] = {}
    for change in changes:
        by_pair.setdefault(int(change["pair"]), []).append(change)
    classes = summary.get("width_classes") or {}
    graded = classes.get("graded", "max")  # changes.csv names its class columns after the graded width
    entries = [_pair_entry(pair, by_pair.get(int(pair["pair"]), []), graded) for pair in pairs]
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
            "classes": f"{classes.get('title') or classes['name']}, by {classes['by']}" if classes else None,
            **{f"length_{side}": sum(_total_length(by_pair.get(entry["index"], []), side, unit) for entry in compared)
               for side in _SIDES},
        },
        "colours": {status: "rgb({}, {}, {})".format(*colour) for status, colour in STATUS_COLOURS.items()},
        "pairs": entries,
    }
    names = [Path(str(summary[key])).name for key in _SIDES if summary.get(key)]
    title = f"crackseg compare: {' → '.join(names) if len(names) == 2 else Path(out).name}"
    report = Path(out) / "report.html"
    write_atomic(report, page(_CHANGE_PAGE, title, data, {"/*CHANGE_ROWS*/": str(CHANGE_ROWS)}))
    return report


def _pair_entry(pair: dict, rows: list[dict], graded: str) -> dict:
    """One pair's row of the pairs table and its section: registration, picture URLs, changes in its unit, width classes
    of the ``graded`` width (max or mean)."""
    unit = "mm" if any(cell_number(row.get(f"length_mm_{side}")) is not None for row in rows for side in _SIDES) else "px"
    changes = [_change_entry(row, unit, graded) for row in rows]
    lengths = {side: _total_length(rows, side, unit) for side in _SIDES}
    inliers = cell_number(pair.get("inliers"))
    return {
        "index": int(pair["pair"]), "name_before": str(pair.get("name_before") or ""), "name_after": str(pair.get("name_after") or ""),
        "status": str(pair["status"]), "section": pair["status"] not in _UNPAIRED,
        "method": str(pair.get("method") or ""), "reason": str(pair.get("reason") or ""),
        "inliers": None if inliers is None else int(inliers), "residual_px": cell_number(pair.get("residual_px")),
        **{f"picture_{side}": relative_url(Path(pair[f"picture_{side}"])) if pair.get(f"picture_{side}") else None
           for side in _SIDES},
        "unit": unit, "changes": changes,
        "changed": sum(change["status"] not in ("unchanged", "not seen") for change in changes),
        "new": sum(change["status"] == "new" for change in changes), "gone": sum(change["status"] == "gone" for change in changes),
        "length_growth": _pair_growth(pair, lengths, unit) if pair["status"] == "registered" else None,
    }


def _pair_growth(pair: dict, lengths: dict, unit: str) -> float:
    """The pair's own length growth (compare writes it in the AFTER image's pixels, BEFORE lengths through the
    registration's scale), else its total length after less before."""
    given = cell_number(pair.get(f"length_growth_{unit}"))
    return given if given is not None else lengths["after"] - lengths["before"]


def _change_entry(row: dict, unit: str, graded: str) -> dict:
    """One row of a pair's change table. Growth is the row's own (compare writes it in the AFTER image's pixels,
    BEFORE sizes through the registration's scale, and a merged or split group's as a whole), else
    after - before, a missing side counting 0 (new: its whole length; gone: minus it)."""
    entry = {"status": str(row["status"]), "class_changed": str(row.get("class_changed", "")).lower() in ("true", "1", "yes")}
    for side in _SIDES:
        entry[side] = int(row[f"crack_{side}"]) if row.get(f"crack_{side}") not in (None, "") else None
        entry[f"class_{side}"] = str(row.get(f"{graded}_width_class_{side}") or "")
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
    columns.push({...text("class_after", S.classes ? `width class (${S.classes})` : "width class", c => c.class_before === c.class_after ? c.class_after : `${c.class_before || "–"} → ${c.class_after || "–"}`),
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
