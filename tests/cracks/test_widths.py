"""Width classes in mm: the standards' presets (their classes, the side of each edge, the width they grade),
custom edges, the pixel size classes need, bad text refused."""

from __future__ import annotations

import pytest

from crackseg.cracks.widths import WIDTH_CLASS_PRESETS, WidthClasses


def test_width_classes():
    bre = WidthClasses.parse("bre251")
    assert [bre.classify(w) for w in (0.05, 0.1, 0.5, 1.0, 3, 10, 20, 40)] == ["0", "0", "1", "1", "2", "3", "4", "5"]
    aci = WidthClasses.parse("aci224")
    assert aci.labels[0] == "<=0.1" and aci.classify(0.16) == "0.15-0.18" and aci.narrowest_band_mm() == pytest.approx(0.03)
    custom = WidthClasses.parse("0.1,0.2,0.3,1.0")
    assert custom.labels == ("<=0.1", "0.1-0.2", "0.2-0.3", "0.3-1", ">1") and custom.classify(2.0) == ">1"
    for bad in ("0.3,0.2", "abc", "-1,2", ""):
        with pytest.raises(ValueError):
            WidthClasses.parse(bad)


@pytest.mark.parametrize("name, widths, classes", [
    # MBEI: CS1 "less than 0.012 in.", CS2 "0.012-0.05 in.", CS3 "greater than 0.05 in.": both edges are CS2's
    ("mbei-rc", (0.3, 0.3048, 1.0, 1.27, 1.2701), ("CS1", "CS2", "CS2", "CS2", "CS3")),
    ("mbei-psc", (0.1, 0.1016, 0.2286, 0.23), ("CS1", "CS2", "CS2", "CS3")),
    # EN 1992-1-1 Table 7.1N: w_max is a limit, so a width on it is within it
    ("ec2", (0.3, 0.35, 0.4, 0.41), ("<=0.3", "0.3-0.4", "0.3-0.4", ">0.4")),
    ("ec2-psc", (0.2, 0.21), ("<=0.2", ">0.2")),
    # D6433 asphalt: M ">= 10 mm and < 75 mm", H "> 75 mm": 75 mm itself goes up
    ("d6433-ac", (9.99, 10, 74.9, 75), ("L", "M", "M", "H")),
    # D6433 concrete: L "< 13 mm", M "13-50 mm", H "> 50 mm": both edges are M's
    ("d6433-pcc", (12.9, 13, 50, 50.01), ("L", "M", "M", "H")),
    # BRE 251 "up to 0.1 mm", ...: an edge belongs to the class below, as before the standards' presets
    ("bre251", (0.1, 1.0, 25.0, 25.01), ("0", "1", "4", "5")),
    ("aci224", (0.41, 0.42), ("0.3-0.41", ">0.41")),
])
def test_each_standard_puts_a_width_on_an_edge_where_it_says(name, widths, classes):
    preset = WidthClasses.parse(name)
    assert tuple(preset.classify(width) for width in widths) == classes


def test_presets_name_their_standard_and_the_width_they_grade():
    from crackseg.cracks.widths import WIDTH_CLASS_PRESETS

    assert all(preset.title and preset.name == name for name, preset in WIDTH_CLASS_PRESETS.items())
    assert {name for name, preset in WIDTH_CLASS_PRESETS.items() if preset.graded == "mean"} == {"d6433-ac", "d6433-pcc"}
    rc, pavement = WidthClasses.parse("mbei-rc"), WidthClasses.parse("d6433-ac")
    assert rc.ranges() == {"CS1": "w < 0.3048", "CS2": "0.3048 <= w <= 1.27", "CS3": "w > 1.27"}
    assert pavement.ranges() == {"L": "w < 10", "M": "10 <= w < 75", "H": "w >= 75"}
    assert WidthClasses.parse("ec2").ranges()["0.3-0.4"] == "0.3 < w <= 0.4"
    assert (rc.graded_column, pavement.graded_column) == ("max_width_class", "mean_width_class")
    crack = {"max_width_mm": 12.0, "mean_width_mm": 4.0, "max_width_mm_after": 80.0, "mean_width_mm_after": 11.0}
    assert (pavement.grade(crack), pavement.grade(crack, "_after"), rc.grade(crack)) == ("L", "M", "CS3")
    assert pavement.as_dict()["by"] == "mean width" and pavement.as_dict()["title"] == "ASTM D6433, asphalt"


def test_the_pixel_size_a_preset_needs_gives_its_narrowest_band_three_pixels():
    assert WidthClasses.parse("mbei-psc").coarsest_px_size_mm() == pytest.approx(0.1016 / 3)
    assert WidthClasses.parse("ec2").coarsest_px_size_mm() == pytest.approx(0.1 / 3)  # 0.3-0.4 is narrower than 0-0.3
    assert WidthClasses.parse("d6433-ac").coarsest_px_size_mm() == pytest.approx(10 / 3)


def test_a_preset_that_contradicts_itself_is_refused():
    with pytest.raises(ValueError, match="one label more than edges"):
        WidthClasses("bad", (1.0, 2.0), ("a", "b"))
    with pytest.raises(ValueError, match="graded max or mean"):
        WidthClasses("bad", (1.0,), ("a", "b"), graded="median")


def test_the_docs_table_gives_every_preset_its_graded_width_and_the_pixel_size_it_needs():
    from pathlib import Path

    from crackseg.cracks.widths import WIDTH_CLASS_PRESETS

    text = (Path(__file__).resolve().parents[2] / "docs" / "predict.md").read_text()
    section = text.split("## Width classes of inspection standards", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0].strip("| `"): cells for cells in (line.split(" | ") for line in section.splitlines() if line.startswith("| `"))}
    assert set(rows) == set(WIDTH_CLASS_PRESETS)
    for name, preset in WIDTH_CLASS_PRESETS.items():
        graded, needed = rows[name][-2], rows[name][-1].removesuffix(" |")
        assert graded.split()[0] == preset.graded
        assert float(needed.removesuffix(" mm")) == pytest.approx(preset.coarsest_px_size_mm(), rel=0.02), name


@pytest.mark.parametrize("preset", sorted(WIDTH_CLASS_PRESETS))
def test_a_width_is_classed_as_the_tables_write_it(preset):
    """A width a float error off an edge is written as the edge (4 decimals) and classed as on it, from either side."""
    classes = WIDTH_CLASS_PRESETS[preset]
    for edge in classes.edges_mm:
        on_edge = classes.classify(edge)
        assert classes.classify(edge * (1 + 1e-12)) == on_edge == classes.classify(edge * (1 - 1e-12))
        assert classes.classify(edge + 2e-4) != classes.classify(edge - 2e-4)
