"""report.html from real predict (+ evaluate) runs, checked in a real headless Chromium.

Skips when no Chromium / chromedriver is installed (.ci/run installs Debian's). Run as a
script it photographs a report: ``python tests/test_report.py REPORT.html OUT.png``.
"""

from __future__ import annotations

import csv
import io
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import dark_pixel_model, pavement, predict_tiled, utm_transform, write_geotiff
from crackseg.cli import main


def browser():
    """A headless Chromium driven through the system's chromedriver (nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1400"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def screenshot(report: Path, png: Path) -> None:
    """The report's first screen as a PNG (the README's picture is made this way)."""
    driver = browser()
    try:
        driver.get(Path(report).resolve().as_uri())
        picture = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
        picture.thumbnail((900, 900))
        picture.save(png, optimize=True)
    finally:
        driver.quit()


needs_browser = pytest.mark.skipif(
    not (shutil.which("chromedriver") and (shutil.which("chromium") or shutil.which("chromium-browser"))),
    reason="no chromium and chromedriver installed",
)


def _photos(folder: Path) -> dict[str, int]:
    """Grey photos with 0-3 dark cracks 3 px wide (gaps in some); returns the cracks drawn per image."""
    folder.mkdir(parents=True)
    (folder.parent / "truth").mkdir()
    drawn = {}
    for index, rows in enumerate([[20], [20, 60], [15, 45, 80], []]):
        photo = np.full((100, 160, 3), 200, np.uint8)
        truth = np.zeros((100, 160), np.uint8)
        for row in rows:
            photo[row : row + 3, 10:150] = 20
            truth[row : row + 3, 10:150] = 255
        if index == 1:
            photo[60:63, 70:75] = 200  # a 5 px gap: still one crack
        Image.fromarray(photo).save(folder / f"img{index}.png")
        Image.fromarray(truth).save(folder.parent / "truth" / f"img{index}.png")
        drawn[f"img{index}"] = len(rows)
    return drawn


@needs_browser
def test_report_in_a_real_browser(tmp_path):
    from selenium.webdriver.common.by import By

    model = dark_pixel_model(tmp_path)
    drawn = _photos(tmp_path / "in")
    assert main(["predict", str(tmp_path / "in"), "--model", str(model), "--out", str(tmp_path / "pred"),
                 "--px-size", "0.5", "--width-classes", "bre251", "--save-prob", "8", "--device", "cpu"]) == 0
    assert main(["evaluate", "--pred", str(tmp_path / "pred" / "probs"), "--gt", str(tmp_path / "truth"), "--out", str(tmp_path / "eval")]) == 0
    assert main(["report", str(tmp_path / "pred"), "--evaluation", str(tmp_path / "eval")]) == 0
    with open(tmp_path / "pred" / "cracks.csv") as file:
        cracks = list(csv.DictReader(file))
    assert {name: sum(Path(c["path"]).stem == name for c in cracks) for name in drawn} == drawn  # one crack per crack

    driver = browser()
    try:
        driver.get((tmp_path / "pred" / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert text("#sum-images") == "4" and text("#sum-cracks") == str(len(cracks))
        assert text("#sum-length") == f"{sum(float(c['length_mm']) for c in cracks) / 1000:.3f} m"
        assert text("#sum-widest").endswith(" mm") and driver.find_element(By.ID, "classes")
        assert driver.find_element(By.ID, "pr-curve") and len(driver.find_elements(By.CSS_SELECTOR, "#worst li")) == 4

        names = lambda: [row.get_attribute("data-name") for row in driver.find_elements(By.CSS_SELECTOR, "tr.image-row")]  # noqa: E731
        assert names() == ["img0", "img1", "img2", "img3"]
        driver.find_element(By.CSS_SELECTOR, 'th[data-key="cracks"]').click()
        assert names() == ["img2", "img1", "img0", "img3"]  # most cracks first
        driver.find_element(By.CSS_SELECTOR, 'th[data-key="cracks"]').click()
        assert names() == ["img3", "img0", "img1", "img2"]

        driver.find_element(By.CSS_SELECTOR, 'tr.image-row[data-name="img2"]').click()
        view = driver.find_element(By.ID, "view")
        assert view.get_attribute("src").endswith("report/overlays/img2.jpg")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#cracks tr")) == 1 + 3
        driver.find_element(By.ID, "toggle").click()
        assert view.get_attribute("src").endswith("report/photos/img2.jpg")
        assert driver.execute_script("return document.getElementById('view').complete && document.getElementById('view').naturalWidth") > 0

        picture = np.asarray(Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("L"), dtype=float)
        assert picture.std() > 10  # not a blank page
        severe = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert severe == [], severe
    finally:
        driver.quit()


@needs_browser
def test_names_that_html_or_urls_give_a_meaning_to_show_as_they_are(tmp_path):
    from selenium.webdriver.common.by import By

    names = ["<!--<script>x", "a#b?c%20d", "back\\slash", "two\nlines", "<b>bold"]
    (tmp_path / "in").mkdir()
    for name in names:
        photo = np.full((40, 60, 3), 200, np.uint8)
        photo[20:23, 5:55] = 20
        Image.fromarray(photo).save(tmp_path / "in" / f"{name}.png")
    model = dark_pixel_model(tmp_path)
    assert main(["predict", str(tmp_path / "in"), "--model", str(model), "--out", str(tmp_path / "pred"), "--report", "--device", "cpu"]) == 0
    driver = browser()
    try:
        driver.get((tmp_path / "pred" / "report.html").as_uri())
        rows = driver.find_elements(By.CSS_SELECTOR, "tr.image-row")
        assert sorted(row.get_attribute("data-name") for row in rows) == sorted(names)
        assert driver.find_element(By.CSS_SELECTOR, "#sum-images").text == str(len(names))
        loaded = driver.execute_script("return [...document.querySelectorAll('img.thumb')].map(i => i.complete && i.naturalWidth > 0)")
        assert loaded == [True] * len(names)
        assert not driver.find_elements(By.CSS_SELECTOR, "tr.image-row b")  # a name is text, never markup
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


@needs_browser
def test_thousands_of_images_stay_paginated(tmp_path):
    from selenium.webdriver.common.by import By

    from crackseg.report import PAGE_ROWS, write_report

    (tmp_path / "masks").mkdir()
    rows = [{"path": f"/nowhere/p{i:04d}.jpg", "mask": str(tmp_path / "masks" / f"p{i:04d}.png"), "width": 10, "height": 10,
             "crack_fraction": i / 3000, "cracks": i % 7, "length_px": float(i), "status": "ok"} for i in range(2500)]
    for row in rows[:3]:
        Image.fromarray(np.zeros((10, 10), np.uint8)).save(row["mask"])
    with open(tmp_path / "predictions.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "summary.json").write_text('{"images": 2500, "cracks": 7500, "length_px": 1.0, "px_size_mm": null, "warnings": []}')
    write_report(tmp_path)
    driver = browser()
    try:
        driver.get((tmp_path / "report.html").as_uri())
        assert len(driver.find_elements(By.CSS_SELECTOR, "tr.image-row")) == PAGE_ROWS
        driver.find_element(By.ID, "next").click()
        assert driver.find_elements(By.CSS_SELECTOR, "tr.image-row")[0].get_attribute("data-name") == f"p{PAGE_ROWS:04d}"
        assert "of 50" in driver.find_element(By.ID, "pager").text
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


@needs_browser
def test_the_report_of_rasters_in_two_scales_gives_metres_and_says_whose_scale(tmp_path, dark_checkpoint):
    pytest.importorskip("rasterio")
    from selenium.webdriver.common.by import By

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "fine.tif", pavement(300, 400))
    write_geotiff(tmp_path / "in" / "coarse.tif", pavement(300, 400), transform=utm_transform(0.004))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--width-classes", "5,10", "--report") == 0
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    driver = browser()
    try:
        driver.get((tmp_path / "out" / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert text("#sum-length") == f"{sum(float(c['length_mm']) for c in cracks) / 1000:.3f} m"
        assert text("#scale").startswith("each raster in its own pixel size") and driver.find_element(By.ID, "classes")
    finally:
        driver.quit()


if __name__ == "__main__":
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))


def test_an_evaluation_under_another_protocol_is_refused_in_one_line(tmp_path):
    from crackseg.errors import InputError
    from crackseg.report import write_report

    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "summary.json").write_text('{"images": 0, "px_size_mm": null, "warnings": []}')
    (tmp_path / "pred" / "predictions.csv").write_text("path,mask,width,height,crack_fraction,status\n")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "report.json").write_text('{"protocol": "scsegamba", "ods": {"f1": 0.5}}')
    with pytest.raises(InputError, match="--protocol scsegamba"):
        write_report(tmp_path / "pred", tmp_path / "eval")
    assert not (tmp_path / "pred" / "report.html").exists()


def _change_page_data(page: str) -> dict:
    """The data a change report's script holds, as the browser parses it (JSON with "<" written as \\u003c)."""
    import json

    return json.loads(page.split("const DATA = ", 1)[1].split(";\nconst PAGE_ROWS", 1)[0])


def test_change_picture_tints_each_crack_in_its_status_colour_at_the_reduced_size():
    from crackseg.report import STATUS_COLOURS, change_picture

    photo = np.full((200, 240, 3), 120, np.uint8)
    photo[100:130, 150:230] = 40  # under the crack without a status: it must stay as photographed
    labels = np.zeros((200, 240), np.int32)
    labels[20:60, 20:100] = 1
    labels[150, 20:220] = 2  # 1 px wide: a quarter of a reduced pixel
    labels[100:130, 150:230] = 3
    picture = np.asarray(Image.open(io.BytesIO(change_picture(photo, labels, {1: "new", 2: "gone"}, max_side=60))), float)
    plain = np.asarray(Image.open(io.BytesIO(change_picture(photo, np.zeros_like(labels), {}, max_side=60))), float)
    assert picture.shape == (50, 60, 3)

    def tinted(status):
        return 0.35 * 120 + 0.65 * np.array(STATUS_COLOURS[status])

    assert np.abs(np.median(picture[5:10, 5:25].reshape(-1, 3), axis=0) - tinted("new")).max() < 6  # rows above its id label
    line = picture[37, 6:54]
    assert np.abs(line - tinted("gone")).mean() < 12 and (line[:, 2] - line[:, 0]).min() > 60
    assert np.abs(picture[34, 6:30] - 120).max() < 12  # the line stays 1 reduced pixel wide
    assert np.abs(picture[25:32, 37:57] - plain[25:32, 37:57]).max() <= 1
    assert np.abs(plain[27:31, 40:55] - 40).max() < 6
    small = change_picture(photo[:40, :50], labels[:40, :50], {1: "wider"})
    assert Image.open(io.BytesIO(small)).size == (50, 40)  # never enlarged


def _change_rows(pair: int, rows: list[tuple], mm: float | None = None) -> list[dict]:
    """changes.csv rows from (before id, after id, status, length before, length after, max width before, max width after)."""
    changes = []
    for before, after, status, length_before, length_after, width_before, width_after in rows:
        row = {"pair": pair, "crack_before": before, "crack_after": after, "status": status,
               "length_px_before": length_before, "length_px_after": length_after,
               "max_width_px_before": width_before, "max_width_px_after": width_after, "top": 0, "left": 0, "bottom": 1, "right": 1}
        if mm:
            row |= {key.replace("_px_", "_mm_"): float(value) * mm if value != "" else "" for key, value in row.items() if "_px_" in key}
        changes.append(row)
    return changes


def test_the_change_report_keeps_names_inert_and_measures_growth_in_mm_where_rows_have_mm(tmp_path):
    from crackseg.report import write_change_report

    name = "</script><!--x/*DATA*/<b>.jpg"
    pairs = [{"pair": 0, "name_before": name, "name_after": "b.jpg", "status": "registered", "method": "orb-affine",
              "inliers": "57", "residual_px": "0.8", "reason": "", "picture_before": None, "picture_after": None},
             {"pair": 1, "name_before": "", "name_after": "c.jpg", "status": "only after"}]
    changes = _change_rows(0, [(1, 1, "longer", "100", "130", "2", "2"), ("", 2, "new", "", "40", "", "3"),
                               (3, "", "gone", "25", "", "1.5", ""), (4, 3, "merged", "30", "70", "2", "4"), (5, 3, "merged", "20", "70", "1", "4")],
                           mm=0.5)
    report = write_change_report(tmp_path, {"before": "<i>2023", "after": "2024", "warnings": ["<!-- w"]}, pairs, changes)
    page = report.read_text()
    assert report == tmp_path / "report.html" and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    assert page.count("</script>") == 1 and "<!--" not in page and "<i>" not in page
    data = _change_page_data(page)
    assert data["pairs"][0]["name_before"] == name and data["summary"]["warnings"] == ["<!-- w"]
    assert [p["section"] for p in data["pairs"]] == [True, False]
    rows = data["pairs"][0]["changes"]
    assert data["pairs"][0]["unit"] == "mm" and [c["length_growth"] for c in rows] == [15.0, 20.0, -12.5, 20.0, 25.0]
    assert [c["max_width_growth"] for c in rows] == [0.0, 1.5, -0.75, 1.0, 1.5]
    summary = data["summary"]
    assert (summary["compared"], summary["unregistered"], summary["unpaired"], summary["unit"]) == (1, 0, 1, "mm")
    assert (summary["length_before"], summary["length_after"]) == (87.5, 120.0)  # the merged crack counted once
    assert summary["statuses"]["merged"] == 2 and summary["statuses"]["split"] == 0


def test_the_change_report_takes_the_growth_compare_measured_in_the_after_frame(tmp_path):
    """Under a 4% scale change a crack's px lengths differ by 4% while it did not grow: the row's own growth counts."""
    from crackseg.report import write_change_report

    pairs = [{"pair": 0, "name_before": "a.jpg", "name_after": "a.jpg", "status": "registered", "method": "orb-similarity"}]
    changes = _change_rows(0, [(1, 1, "unchanged", "500", "520", "3", "3"), ("", 2, "new", "", "40", "", "3")])
    changes[0] |= {"length_growth_px": "0.4", "max_width_growth_px": "-0.1"}
    data = _change_page_data(write_change_report(tmp_path, {}, pairs, changes).read_text())
    assert [(c["length_growth"], c["max_width_growth"]) for c in data["pairs"][0]["changes"]] == [(0.4, -0.1), (40.0, 3.0)]


@needs_browser
def test_the_change_report_in_a_real_browser(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from crackseg.report import CHANGE_ROWS, STATUS_COLOURS, change_picture, write_change_report

    photo = np.full((64, 96, 3), 170, np.uint8)
    before, after = np.zeros((64, 96), np.int32), np.zeros((64, 96), np.int32)
    before[10, 5:60], after[10, 5:80] = 1, 1
    before[30:32, 5:40], after[30:34, 5:40] = 2, 2
    after[50, 10:90] = 3
    before[55, 5:30] = 4
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "pair0-before.jpg").write_bytes(change_picture(photo, before, {1: "longer", 2: "wider", 4: "gone"}))
    (tmp_path / "report" / "pair0-after.jpg").write_bytes(change_picture(photo, after, {1: "longer", 2: "wider", 3: "new"}))
    (tmp_path / "report" / "pair1-before.jpg").write_bytes(change_picture(photo, before, {}))
    pairs = [{"pair": 0, "name_before": "<b>a</b>.jpg", "name_after": "a.jpg", "status": "registered", "method": "orb-similarity",
              "inliers": 80, "residual_px": 0.61, "reason": "", "picture_before": "report/pair0-before.jpg", "picture_after": "report/pair0-after.jpg"},
             {"pair": 1, "name_before": "d.jpg", "name_after": "d.jpg", "status": "unregistered", "method": "none", "inliers": 4,
              "residual_px": None, "reason": "too few feature matches (4)", "picture_before": "report/pair1-before.jpg", "picture_after": None},
             {"pair": 2, "name_after": "e.jpg", "status": "only after"}]
    changes = _change_rows(0, [(1, 1, "longer", 55, 75, 1, 1), (2, 2, "wider", 35, 35, 2, 4), ("", 3, "new", "", 80, "", 1),
                               (4, "", "gone", 25, "", 1, ""), (5, 6, "longer+wider", 10, 18, 1, 3), (7, 8, "unchanged", 9, 9, 1, 1)])
    changes[1] |= {"max_width_class_before": "fine", "max_width_class_after": "medium", "class_changed": "True"}
    write_change_report(tmp_path, {"before": "2023", "after": "2024"}, pairs, changes)
    many = tmp_path / "many"
    many.mkdir()
    write_change_report(many, {}, [pairs[0] | {"picture_before": None, "picture_after": None}],
                        _change_rows(0, [(i, i, "unchanged", 100, 100 + i % 997, 1, 1) for i in range(1, 3001)]))

    driver = browser()
    try:
        driver.get((tmp_path / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert (text("#sum-compared"), text("#sum-unregistered"), text("#sum-unpaired")) == ("1", "1", "1")
        assert (text("#sum-new"), text("#sum-gone"), text("#sum-split")) == ("1", "1", "0")
        assert text("#sum-length-before") == "134 px" and text("#sum-length-after") == "217 px"
        assert len(driver.find_elements(By.CSS_SELECTOR, "tr.pair-row")) == 3
        assert [s.get_attribute("id") for s in driver.find_elements(By.CSS_SELECTOR, "section.pair")] == ["pair-0", "pair-1"]
        assert text("#pair-0 h2") == "<b>a</b>.jpg → a.jpg" and not driver.find_elements(By.CSS_SELECTOR, "section.pair b")

        for picture in driver.find_elements(By.CSS_SELECTOR, "section.pair img"):
            driver.execute_script("arguments[0].scrollIntoView()", picture)
            WebDriverWait(driver, 10).until(lambda _: driver.execute_script("return arguments[0].complete", picture))
        sizes = driver.execute_script("return [...document.querySelectorAll('section.pair img')].map(i => i.naturalWidth)")
        assert sizes == [96, 96, 96]
        assert "no picture" in text("#pair-1 .pictures")

        rows = lambda: [row.get_attribute("data-status") for row in driver.find_elements(By.CSS_SELECTOR, "#changes-0 tr.change-row")]  # noqa: E731
        assert rows() == ["new", "longer", "longer+wider", "wider", "unchanged", "gone"]  # largest length growth first
        driver.find_element(By.CSS_SELECTOR, '#changes-0 th[data-key="length_growth"]').click()
        assert rows() == ["gone", "wider", "unchanged", "longer+wider", "longer", "new"]
        driver.find_element(By.CSS_SELECTOR, '#changes-0 th[data-key="max_width_growth"]').click()
        assert rows() == ["wider", "longer+wider", "new", "longer", "unchanged", "gone"]
        assert "growth" in text('#changes-0 th[aria-sort="descending"]')
        assert "+80 px" in text("#changes-0 tbody tr:nth-child(3)")
        assert text('#changes-0 tr[data-status="wider"] td.changed') == "fine → medium"

        assert "too few feature matches (4)" in text("#pair-1 .registration")
        assert not driver.find_elements(By.CSS_SELECTOR, "#pair-1 table, #pair-1 .legend")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#pair-0 .legend li")) == len(STATUS_COLOURS)
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]

        driver.get((many / "report.html").as_uri())
        growths = lambda: [row.find_elements(By.TAG_NAME, "td")[5].text for row in driver.find_elements(By.CSS_SELECTOR, "tr.change-row")]  # noqa: E731
        assert growths() == ["+996 px"] * 3 + ["+995 px"] * 3 + ["+994 px"] * 3 + ["+993 px"] * 3 + ["+992 px"] * 3 + ["+991 px"] * 3 + ["+990 px"] * 2
        assert len(growths()) == CHANGE_ROWS and "page 1 of 150" in text("#pair-0 .pager")
        driver.find_element(By.CSS_SELECTOR, "#pair-0 .pager .next").click()
        assert growths()[0] == "+990 px" and "page 2 of 150" in text("#pair-0 .pager")
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
