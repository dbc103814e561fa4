"""report.html from real predict (+ evaluate) runs, checked in a real headless Chromium.

Skips when no Chromium / chromedriver is installed (.ci/run installs Debian's). Run as a
script it photographs a report: ``python tests/prediction/test_report.py REPORT.html OUT.png``.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    assert_soon,
    browser,
    cli_result,
    csv_rows,
    loaded_pictures,
    dark_pixel_model,
    needs_browser,
    pavement,
    predict_cli,
    predict_photos_named,
    predict_tiled,
    utm_transform,
    write_geotiff,
)
from PIL import Image

from crackseg.cli.main import main


def screenshot(report: Path, png: Path) -> None:
    """The report's first screen as a PNG (the README's picture is made this way)."""
    driver = browser()
    try:
        driver.get(Path(report).resolve().as_uri())
        on_screen = "return [...document.images].filter(i => i.getBoundingClientRect().top < innerHeight).every(i => i.complete)"
        assert_soon(driver, lambda: driver.execute_script(on_screen), True)  # the first screen's pictures, loaded
        picture = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
        picture.thumbnail((900, 900))
        picture.save(png, optimize=True)
    finally:
        driver.quit()


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
        assert_soon(driver, lambda: (text("#sum-images"), text("#sum-cracks")), ("4", str(len(cracks))))
        assert text("#sum-length") == f"{sum(float(c['length_mm']) for c in cracks) / 1000:.3f} m"
        assert text("#sum-widest").endswith(" mm") and driver.find_element(By.ID, "classes")
        assert driver.find_element(By.ID, "pr-curve")
        assert_soon(driver, lambda: len(driver.find_elements(By.CSS_SELECTOR, "#worst li")), 4)

        names = lambda: [row.get_attribute("data-name") for row in driver.find_elements(By.CSS_SELECTOR, "tr.image-row")]  # noqa: E731
        assert_soon(driver, names, ["img0", "img1", "img2", "img3"])
        driver.find_element(By.CSS_SELECTOR, 'th[data-key="cracks"]').click()
        assert_soon(driver, names, ["img2", "img1", "img0", "img3"])  # most cracks first
        driver.find_element(By.CSS_SELECTOR, 'th[data-key="cracks"]').click()
        assert_soon(driver, names, ["img3", "img0", "img1", "img2"])

        driver.find_element(By.CSS_SELECTOR, 'tr.image-row[data-name="img2"]').click()
        source = lambda: driver.find_element(By.ID, "view").get_attribute("src").rsplit("/", 3)[-3:]  # noqa: E731
        assert_soon(driver, source, ["report", "overlays", "img2.jpg"])
        assert_soon(driver, lambda: len(driver.find_elements(By.CSS_SELECTOR, "#cracks tr")), 1 + 3)
        driver.find_element(By.ID, "toggle").click()
        assert_soon(driver, source, ["report", "photos", "img2.jpg"])
        shown = "const view = document.getElementById('view'); return view.complete && view.naturalWidth > 0"
        assert_soon(driver, lambda: driver.execute_script(shown), True)  # loaded, not merely asked for

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
        rows = lambda: sorted(row.get_attribute("data-name") for row in driver.find_elements(By.CSS_SELECTOR, "tr.image-row"))  # noqa: E731
        assert_soon(driver, rows, sorted(names))
        assert_soon(driver, lambda: driver.find_element(By.CSS_SELECTOR, "#sum-images").text, str(len(names)))
        widths = loaded_pictures(driver, "img.thumb")
        assert len(widths) == len(names) and all(width > 0 for width in widths), widths
        assert not driver.find_elements(By.CSS_SELECTOR, "tr.image-row b")  # a name is text, never markup
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


@needs_browser
def test_thousands_of_images_stay_paginated(tmp_path):
    from selenium.webdriver.common.by import By

    from crackseg.core.html import PAGE_ROWS
    from crackseg.prediction.report import write_report

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
        assert_soon(driver, lambda: len(driver.find_elements(By.CSS_SELECTOR, "tr.image-row")), PAGE_ROWS)
        driver.find_element(By.ID, "next").click()
        first = lambda: [row.get_attribute("data-name") for row in driver.find_elements(By.CSS_SELECTOR, "tr.image-row")][:1]  # noqa: E731
        assert_soon(driver, first, [f"p{PAGE_ROWS:04d}"])
        assert_soon(driver, lambda: "of 50" in driver.find_element(By.ID, "pager").text, True)
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


@needs_browser
def test_the_report_of_rasters_in_two_scales_gives_metres_and_says_whose_scale(tmp_path, dark_checkpoint):
    pytest.importorskip("rasterio")
    from selenium.webdriver.common.by import By

    (tmp_path / "in").mkdir()
    fine = pavement(300, 400)
    fine[:, 149:153, 50:350] = 30  # wider in pixels than the coarse raster's cracks, narrower in mm
    write_geotiff(tmp_path / "in" / "a_fine.tif", fine)
    write_geotiff(tmp_path / "in" / "b_coarse.tif", pavement(300, 400), transform=utm_transform(0.004))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--width-classes", "5,10", "--report") == 0
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    widest = max(cracks, key=lambda c: float(c["max_width_mm"]))
    assert widest["path"].endswith("b_coarse.tif") and float(widest["max_width_px"]) < max(float(c["max_width_px"]) for c in cracks)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["widest"]["path"], summary["widest"]["crack"]) == (widest["path"], int(widest["crack"]))
    driver = browser()
    try:
        driver.get((tmp_path / "out" / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert_soon(driver, lambda: text("#sum-length"), f"{sum(float(c['length_mm']) for c in cracks) / 1000:.3f} m")
        assert text("#sum-widest") == f"{float(widest['max_width_mm']):.4f} mm"
        assert_soon(driver, lambda: text("#scale").startswith("each raster in its own pixel size"), True)
        assert driver.find_element(By.ID, "classes")
        names = lambda: [row.get_attribute("data-name") for row in driver.find_elements(By.CSS_SELECTOR, "tr.image-row")]  # noqa: E731
        for key in ("widest", "length"):  # most first: in mm, as the page shows them
            driver.find_element(By.CSS_SELECTOR, f'th[data-key="{key}"]').click()
            assert_soon(driver, names, ["b_coarse", "a_fine"])
    finally:
        driver.quit()


@needs_browser
def test_a_report_of_a_run_without_measurements_says_so_instead_of_zeros(tmp_path):
    from selenium.webdriver.common.by import By

    _photos(tmp_path / "in")
    assert main(["predict", str(tmp_path / "in"), "--model", str(dark_pixel_model(tmp_path)), "--out", str(tmp_path / "pred"),
                 "--no-measure", "--report", "--device", "cpu"]) == 0
    driver = browser()
    try:
        driver.get((tmp_path / "pred" / "report.html").as_uri())
        cells = lambda: [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, 'tr.image-row[data-name="img2"] td')]  # noqa: E731
        assert_soon(driver, lambda: cells()[2:5], ["not measured"] * 3)
        assert float(cells()[5].rstrip(" %")) > 0  # its crack pixels are known
        assert [driver.find_element(By.ID, key).text for key in ("sum-cracks", "sum-length", "sum-widest")] == ["not measured"] * 3
        for key in ("length", "widest", "cracks"):  # sorting what was not measured keeps the page working
            driver.find_element(By.CSS_SELECTOR, f'th[data-key="{key}"]').click()
        assert len(driver.find_elements(By.CSS_SELECTOR, "tr.image-row")) == 4
        assert [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"] == []
    finally:
        driver.quit()


@needs_browser
def test_widths_in_mm_show_as_the_tables_write_and_class_them_and_a_crack_free_photo_in_mm_too(tmp_path, dark_checkpoint):
    """A 3 px crack at 0.1016 mm per pixel is 0.3048 mm, MBEI's CS2 edge: shown as 0.30 mm it read as the class below."""
    from selenium.webdriver.common.by import By

    photo = np.full((200, 200, 3), 200, np.uint8)
    photo[50:53, 20:180] = 20
    (tmp_path / "in").mkdir()
    Image.fromarray(photo).save(tmp_path / "in" / "crack.png")
    Image.fromarray(np.full((200, 200, 3), 200, np.uint8)).save(tmp_path / "in" / "clean.png")
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--px-size", "0.1016",
                       "--width-classes", "mbei-rc", "--report") == 0
    (crack,) = csv_rows(tmp_path / "out" / "cracks.csv")
    assert crack["max_width_class"] == "CS2" and float(crack["max_width_mm"]) == pytest.approx(0.3048)
    driver = browser()
    try:
        driver.get((tmp_path / "out" / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert_soon(driver, lambda: text("#sum-widest"), f"{float(crack['max_width_mm']):.4f} mm")
        widths = {row.get_attribute("data-name"): row.find_elements(By.CSS_SELECTOR, "td")[4].text
                  for row in driver.find_elements(By.CSS_SELECTOR, "tr.image-row")}
        assert widths == {"crack": f"{float(crack['max_width_mm']):.4f} mm", "clean": "0.0000 mm"}
    finally:
        driver.quit()


@needs_browser
def test_the_legend_of_width_classes_names_the_standard_its_classes_and_the_width_it_grades(tmp_path, dark_checkpoint):
    from selenium.webdriver.common.by import By

    photo = np.full((60, 240, 3), 200, np.uint8)
    photo[28:32, 10:230] = photo[23:37, 100:116] = 20  # mean width about 5 mm (L), max 14 mm (M)
    (tmp_path / "in").mkdir()
    Image.fromarray(photo).save(tmp_path / "in" / "road.png")
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--px-size", "1",
                       "--width-classes", "d6433-ac", "--report") == 0
    driver = browser()
    try:
        driver.get((tmp_path / "out" / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert_soon(driver, lambda: text("#classes-standard"), "ASTM D6433, asphalt (--width-classes d6433-ac): each crack is classed by its mean width")
        rows = [[cell.text for cell in row.find_elements(By.CSS_SELECTOR, "th, td")] for row in driver.find_elements(By.CSS_SELECTOR, "#classes tr")]
        assert rows[0] == ["class", "mean width w", "cracks", "length"]
        assert [row[:3] for row in rows[1:]] == [["L", "w < 10 mm", "1"], ["M", "10 <= w < 75 mm", "0"], ["H", "w >= 75 mm", "0"]]
    finally:
        driver.quit()


def test_an_evaluation_under_another_protocol_is_refused_in_one_line(tmp_path):
    from crackseg.core.errors import InputError
    from crackseg.prediction.report import write_report

    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "summary.json").write_text('{"images": 0, "px_size_mm": null, "warnings": []}')
    (tmp_path / "pred" / "predictions.csv").write_text("path,mask,width,height,crack_fraction,status\n")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "report.json").write_text('{"protocol": "scsegamba", "ods": {"f1": 0.5}}')
    with pytest.raises(InputError, match="--protocol scsegamba"):
        write_report(tmp_path / "pred", tmp_path / "eval")
    assert not (tmp_path / "pred" / "report.html").exists()


@pytest.mark.parametrize("case", ["report.json a list", "report.json null", "predictions a file", "evaluation a file",
                                  "no predictions folder"])
def test_what_is_not_a_predictions_or_evaluation_folder_is_a_one_line_error(tmp_path, case, capsys):
    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "summary.json").write_text('{"images": 0, "px_size_mm": null, "warnings": []}')
    (tmp_path / "pred" / "predictions.csv").write_text("path,mask,width,height,crack_fraction,status\n")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "report.json").write_text({"report.json a list": "[1]", "report.json null": "null"}.get(case, "{}"))
    (tmp_path / "file.pt").write_bytes(b"not a folder")
    predictions = {"predictions a file": tmp_path / "file.pt", "no predictions folder": tmp_path / "nowhere"}.get(case, tmp_path / "pred")
    evaluation = tmp_path / "file.pt" if case == "evaluation a file" else tmp_path / "eval"
    with pytest.raises(SystemExit) as exit:
        main(["report", str(predictions), "--evaluation", str(evaluation)])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.startswith("crackseg: error: ") and err.count("\n") == 1, err
    named = {"predictions a file": "file.pt: not a folder", "evaluation a file": "file.pt: not a folder",
             "no predictions folder": "nowhere: no such folder"}.get(case, "report.json: not what crackseg writes there")
    assert named in err and not (tmp_path / "pred" / "report.html").exists()


def test_the_report_names_and_pictures_photos_whose_names_look_like_formulas(tmp_path, monkeypatch, dark_checkpoint):
    """predictions.csv holds '=x.jpg (a spreadsheet must not run it); the report reads back =x.jpg and finds the photo."""
    import json

    from crackseg.prediction.report import write_report

    names = ["=x.jpg", "+1.jpg", "plain.jpg"]
    predict_photos_named(names, tmp_path / "in", dark_checkpoint, tmp_path / "pred", monkeypatch)
    page = write_report(tmp_path / "pred").read_text(encoding="utf-8")
    images = json.loads(page.split("const DATA = ", 1)[1].split(";\nconst PAGE_ROWS", 1)[0])["images"]
    assert sorted(image["path"] for image in images) == sorted(names)
    assert all(image["thumbs"] and image["cracks"] == 1 and len(image["cracks_table"]) == 1 for image in images)
    assert (tmp_path / "pred" / "report" / "photos" / "=x.jpg").is_file()


if __name__ == "__main__":
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))


@pytest.mark.parametrize("table, reason", [(b"\xff\xfe\x00garbage\x81", "not a table crackseg wrote"), (b"", "(empty)"),
                                           (b"x,y\n1,2\n", "(no path, mask column)")])
@pytest.mark.parametrize("command", [["report"], ["labels", "rank"], ["labels", "export", "--format", "coco", "--out", "x.json"]])
def test_a_predictions_table_that_is_not_one_is_a_one_line_error(tmp_path, table, reason, command, capsys):
    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "summary.json").write_text('{"images": 0, "px_size_mm": null, "warnings": [], "threshold": 0.5}')
    (tmp_path / "pred" / "predictions.csv").write_bytes(table)
    with pytest.raises(SystemExit) as exit:
        main([*command[:2], str(tmp_path / "pred"), *[str(tmp_path / part) if part.endswith(".json") else part for part in command[2:]]]
             if command[0] == "labels" else [command[0], str(tmp_path / "pred")])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and "predictions.csv: " in err and reason in err, err


def test_a_mask_predictions_csv_names_that_is_missing_or_damaged_is_a_one_line_error(tmp_path, capsys):
    _photos(tmp_path / "in")
    assert main(["predict", str(tmp_path / "in"), "--model", str(dark_pixel_model(tmp_path)), "--out", str(tmp_path / "pred"),
                 "--device", "cpu"]) == 0
    (tmp_path / "pred" / "masks" / "img1.png").write_bytes(b"not a png")
    for command in (["report", str(tmp_path / "pred")],
                    ["labels", "export", str(tmp_path / "pred"), "--format", "coco", "--out", str(tmp_path / "x.json")]):
        with pytest.raises(SystemExit) as exit:
            main(command)
        err = capsys.readouterr().err
        assert exit.value.code == 2 and err.count("\n") == 1 and "predictions.csv names this mask" in err, err
    (tmp_path / "pred" / "masks" / "img1.png").unlink()  # removed: labels export cannot do without it, the report can
    code, err = cli_result(["labels", "export", tmp_path / "pred", "--format", "coco", "--out", tmp_path / "x.json"])
    assert code == 2 and err.count("\n") == 1 and "predictions.csv names this mask" in err, err
    assert main(["report", str(tmp_path / "pred")]) == 0


def test_a_damaged_saved_overlay_is_drawn_again_from_the_mask(tmp_path):
    _photos(tmp_path / "in")
    args = ["--model", str(dark_pixel_model(tmp_path)), "--device", "cpu", "--overlay"]
    assert main(["predict", str(tmp_path / "in"), *args, "--out", str(tmp_path / "pred")]) == 0
    assert main(["predict", str(tmp_path / "in"), *args, "--out", str(tmp_path / "whole"), "--report"]) == 0
    saved = tmp_path / "pred" / "overlays" / "img1.jpg"
    saved.write_bytes(saved.read_bytes()[:200])
    assert main(["report", str(tmp_path / "pred")]) == 0
    drawn = np.asarray(Image.open(tmp_path / "pred" / "report" / "overlays" / "img1.jpg"), np.float32)
    whole = np.asarray(Image.open(tmp_path / "whole" / "report" / "overlays" / "img1.jpg"), np.float32)
    assert drawn.shape == whole.shape and np.abs(drawn - whole).mean() < 4  # the same picture, JPEG-encoded twice
