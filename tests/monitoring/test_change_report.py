"""compare's report.html from plain rows: the change pictures, names kept inert, growth in the unit the rows have,
and the page in a real headless Chromium (skipped without one, see test_report.py)."""

from __future__ import annotations

import io

import numpy as np
from conftest import assert_soon, browser, loaded_pictures, needs_browser
from PIL import Image


def _change_page_data(page: str) -> dict:
    """The data a change report's script holds, as the browser parses it (JSON with "<" written as \\u003c)."""
    import json

    return json.loads(page.split("const DATA = ", 1)[1].split(";\nconst PAGE_ROWS", 1)[0])


def test_change_picture_tints_each_crack_in_its_status_colour_at_the_reduced_size():
    from crackseg.monitoring.report import STATUS_COLOURS, change_picture

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
    from crackseg.monitoring.report import write_change_report

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
    from crackseg.monitoring.report import write_change_report

    pairs = [{"pair": 0, "name_before": "a.jpg", "name_after": "a.jpg", "status": "registered", "method": "orb-similarity"}]
    changes = _change_rows(0, [(1, 1, "unchanged", "500", "520", "3", "3"), ("", 2, "new", "", "40", "", "3")])
    changes[0] |= {"length_growth_px": "0.4", "max_width_growth_px": "-0.1"}
    data = _change_page_data(write_change_report(tmp_path, {}, pairs, changes).read_text())
    assert [(c["length_growth"], c["max_width_growth"]) for c in data["pairs"][0]["changes"]] == [(0.4, -0.1), (40.0, 3.0)]


@needs_browser
def test_the_change_report_in_a_real_browser(tmp_path):
    from selenium.webdriver.common.by import By

    from crackseg.monitoring.report import CHANGE_ROWS, STATUS_COLOURS, change_picture, write_change_report

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
        assert_soon(driver, lambda: (text("#sum-compared"), text("#sum-unregistered"), text("#sum-unpaired")), ("1", "1", "1"))
        assert (text("#sum-new"), text("#sum-gone"), text("#sum-split")) == ("1", "1", "0")
        assert text("#sum-length-before") == "134 px" and text("#sum-length-after") == "217 px"
        assert_soon(driver, lambda: len(driver.find_elements(By.CSS_SELECTOR, "tr.pair-row")), 3)
        assert [s.get_attribute("id") for s in driver.find_elements(By.CSS_SELECTOR, "section.pair")] == ["pair-0", "pair-1"]
        assert text("#pair-0 h2") == "<b>a</b>.jpg → a.jpg" and not driver.find_elements(By.CSS_SELECTOR, "section.pair b")

        assert loaded_pictures(driver, "section.pair img") == [96, 96, 96]
        assert "no picture" in text("#pair-1 .pictures")

        rows = lambda: [row.get_attribute("data-status") for row in driver.find_elements(By.CSS_SELECTOR, "#changes-0 tr.change-row")]  # noqa: E731
        assert_soon(driver, rows, ["new", "longer", "longer+wider", "wider", "unchanged", "gone"])  # largest length growth first
        driver.find_element(By.CSS_SELECTOR, '#changes-0 th[data-key="length_growth"]').click()
        assert_soon(driver, rows, ["gone", "wider", "unchanged", "longer+wider", "longer", "new"])
        driver.find_element(By.CSS_SELECTOR, '#changes-0 th[data-key="max_width_growth"]').click()
        assert_soon(driver, rows, ["wider", "longer+wider", "new", "longer", "unchanged", "gone"])
        assert_soon(driver, lambda: "growth" in text('#changes-0 th[aria-sort="descending"]'), True)
        assert "+80 px" in text("#changes-0 tbody tr:nth-child(3)")
        assert text('#changes-0 tr[data-status="wider"] td.changed') == "fine → medium"

        assert "too few feature matches (4)" in text("#pair-1 .registration")
        assert not driver.find_elements(By.CSS_SELECTOR, "#pair-1 table, #pair-1 .legend")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#pair-0 .legend li")) == len(STATUS_COLOURS)
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]

        driver.get((many / "report.html").as_uri())
        growths = lambda: [row.find_elements(By.TAG_NAME, "td")[5].text for row in driver.find_elements(By.CSS_SELECTOR, "tr.change-row")]  # noqa: E731
        assert_soon(driver, growths, ["+996 px"] * 3 + ["+995 px"] * 3 + ["+994 px"] * 3 + ["+993 px"] * 3 + ["+992 px"] * 3
                    + ["+991 px"] * 3 + ["+990 px"] * 2)
        assert len(growths()) == CHANGE_ROWS and "page 1 of 150" in text("#pair-0 .pager")
        driver.find_element(By.CSS_SELECTOR, "#pair-0 .pager .next").click()
        assert_soon(driver, lambda: (growths()[:1], "page 2 of 150" in text("#pair-0 .pager")), (["+990 px"], True))
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
