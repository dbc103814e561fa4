"""QGIS default styles (crackseg/cracks/styles.py): QML that parses as QGIS writes it, cracks categorised by the graded width's
classes in class order, change statuses by the report's colours, and the rows of QGIS's layer_styles table."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from crackseg.cracks.styles import categorized_style, layer_styles_columns, single_line_style, width_class_style
from crackseg.cracks.widths import WIDTH_CLASS_PRESETS, WidthClasses


def parse_qml(qml: str) -> ET.Element:
    """The <qgis> root of a QML document, checked for what QGIS needs to take it as a line layer's symbology."""
    assert qml.startswith("<!DOCTYPE qgis PUBLIC 'http://mrcc.com/qgis.dtd' 'SYSTEM'>\n")
    root = ET.fromstring(qml)
    assert root.tag == "qgis" and root.get("version").startswith("3.") and root.get("styleCategories") == "Symbology"
    assert root.findtext("layerGeometryType") == "1"  # line
    return root


def symbols_by_name(renderer: ET.Element) -> dict[str, tuple[tuple[int, ...], float]]:
    """{symbol name: ((r, g, b, a), width in mm)} of a renderer's simple line symbols."""
    found = {}
    for symbol in renderer.find("symbols"):
        assert symbol.get("type") == "line"
        (layer,) = symbol.findall("layer")
        assert layer.get("class") == "SimpleLine" and layer.find("Option").get("type") == "Map"
        options = {option.get("name"): option.get("value") for option in layer.find("Option")}
        assert options["line_width_unit"] == "MM" and options["line_style"] == "solid"
        found[symbol.get("name")] = (tuple(int(v) for v in options["line_color"].split(",")), float(options["line_width"]))
    return found


@pytest.mark.parametrize("preset", sorted(WIDTH_CLASS_PRESETS))
def test_cracks_are_categorised_by_the_graded_class_from_yellow_to_dark_red(preset):
    classes = WIDTH_CLASS_PRESETS[preset]
    renderer = parse_qml(width_class_style(classes)).find("renderer-v2")
    assert renderer.get("type") == "categorizedSymbol" and renderer.get("attr") == classes.graded_column
    categories = renderer.find("categories").findall("category")
    assert [c.get("value") for c in categories] == [*classes.labels, ""]  # "" last: QGIS's "all other values", NULL too
    assert [c.get("label") for c in categories] == [*classes.labels, "no class"]
    symbols = symbols_by_name(renderer)
    drawn = [symbols[c.get("symbol")] for c in categories]
    assert len(set(c.get("symbol") for c in categories)) == len(categories) and all(c.get("render") == "true" for c in categories)
    colours, widths = [colour for colour, _ in drawn[:-1]], [width for _, width in drawn[:-1]]
    assert colours[0][:3] == (254, 217, 118) and colours[-1][:3] == (128, 0, 38) and all(c[3] == 255 for c in colours)
    assert all(sum(a[:3]) > sum(b[:3]) for a, b in zip(colours, colours[1:]))  # darker class by class
    assert widths == sorted(widths) and widths[0] < widths[-1]
    assert drawn[-1][0][:3] == (150, 150, 150)


def test_the_mean_width_standards_and_custom_edges_colour_their_own_column():
    assert parse_qml(width_class_style(WIDTH_CLASS_PRESETS["d6433-ac"])).find("renderer-v2").get("attr") == "mean_width_class"
    custom = WidthClasses.parse("0.1,0.2,0.3,1.0")
    categories = parse_qml(width_class_style(custom)).find("renderer-v2/categories")
    assert [c.get("value") for c in categories] == ["<=0.1", "0.1-0.2", "0.2-0.3", "0.3-1", ">1", ""]  # escaped, read back


def test_without_width_classes_every_crack_is_one_red_line():
    assert width_class_style(None) == single_line_style()
    renderer = parse_qml(width_class_style(None)).find("renderer-v2")
    assert renderer.get("type") == "singleSymbol" and renderer.find("categories") is None
    assert symbols_by_name(renderer) == {"0": ((227, 26, 28, 255), 0.6)}


def test_a_categorised_style_lists_its_values_in_order_and_draws_no_others_unless_asked():
    colours = {"unchanged": (150, 150, 150), "new": (230, 0, 200), "longer+wider": (170, 0, 20)}
    renderer = parse_qml(categorized_style("status", colours)).find("renderer-v2")
    categories = renderer.find("categories")
    assert renderer.get("attr") == "status" and [c.get("value") for c in categories] == list(colours)
    symbols = symbols_by_name(renderer)
    assert [symbols[c.get("symbol")][0] for c in categories] == [(*colour, 255) for colour in colours.values()]
    with_other = parse_qml(categorized_style("status", colours, other="other")).find("renderer-v2/categories")
    assert [(c.get("value"), c.get("label")) for c in with_other][-1] == ("", "other")


def test_layer_styles_rows_are_default_styles_as_qgis_finds_them():
    columns = layer_styles_columns([("cracks", "geom", "<qml a/>"), ("changes", "geometry", "<qml b/>")])
    assert list(columns) == ["f_table_catalog", "f_table_schema", "f_table_name", "f_geometry_column", "styleName", "styleQML",
                             "styleSLD", "useAsDefault", "description", "owner", "ui", "update_time"]
    assert list(columns["f_table_schema"]) == ["", ""]  # QGIS selects f_table_schema = '', not NULL
    assert list(columns["f_table_name"]) == list(columns["styleName"]) == ["cracks", "changes"]
    assert list(columns["f_geometry_column"]) == ["geom", "geometry"] and list(columns["styleQML"]) == ["<qml a/>", "<qml b/>"]
    assert columns["useAsDefault"].dtype == bool and columns["useAsDefault"].all()
    assert columns["update_time"].dtype == np.dtype("datetime64[ms]")
