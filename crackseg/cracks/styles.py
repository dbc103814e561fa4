"""QGIS default styles for crackseg's line layers: QML, QGIS's XML style, and the rows of a GeoPackage's ``layer_styles``.

QGIS styles a layer on opening from its default style: a GeoPackage layer's is its row of the file's
``layer_styles`` table with ``useAsDefault`` set (the table QGIS writes on "Save as Default"; QGIS finds it
by ``f_table_schema = ''``, the layer's name and its geometry column), a GeoJSON's the ``.qml`` of the
same name beside it. The QML is what QGIS 3.18 and later write (symbol layer properties as an
``<Option type="Map">``), cut to the symbology: renderer, categories, symbols.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone

import numpy as np

from crackseg.cracks.widths import WidthClasses

QGIS_VERSION = "3.28.0-Firenze"  # the QGIS release whose QML this is (an LTR; later ones read it unchanged)
LINE_MM = 0.6  # line width on screen, mm
CRACK_COLOUR = (227, 26, 28)  # cracks without width classes: red
OTHER_COLOUR = (150, 150, 150)  # a value no category names (NULL included): grey
# Width classes from the narrowest to the widest: ColorBrewer's YlOrRd from its yellow on, legible on white and on photos.
_WIDTH_RAMP = ((254, 217, 118), (253, 141, 60), (227, 26, 28), (128, 0, 38))
_DOCTYPE = "<!DOCTYPE qgis PUBLIC 'http://mrcc.com/qgis.dtd' 'SYSTEM'>"
_RENDERER = {"symbollevels": "0", "forceraster": "0", "enableorderby": "0", "referencescale": "-1"}  # as QGIS writes them
_LINE_GEOMETRY = "1"  # QGIS's geometry type code of line layers: QGIS refuses a style made for another type


def single_line_style(colour: tuple[int, int, int] = CRACK_COLOUR) -> str:
    """QML drawing every feature as one solid line of ``colour`` (r, g, b)."""
    renderer = ET.Element("renderer-v2", type="singleSymbol", **_RENDERER)
    ET.SubElement(renderer, "symbols").append(_line_symbol("0", colour, LINE_MM))
    return _qml(renderer)


def categorized_style(field: str, colours: dict[str, tuple[int, int, int]], widths_mm: list[float] | None = None,
                      other: str | None = None) -> str:
    """QML colouring lines by the text of ``field``: one category per key of ``colours``, listed in its order, with
    ``widths_mm`` per category (default :data:`LINE_MM`). With ``other``, a last category under that label draws any other
    value, NULL included, grey (QGIS's "all other values": the category of the empty value); without, they are not drawn."""
    widths = widths_mm or [LINE_MM] * len(colours)
    renderer = ET.Element("renderer-v2", type="categorizedSymbol", attr=field, **_RENDERER)
    categories, symbols = ET.SubElement(renderer, "categories"), ET.SubElement(renderer, "symbols")
    entries = [*zip(colours, colours.values(), widths), *([("", OTHER_COLOUR, LINE_MM)] if other is not None else [])]
    for index, (value, colour, width) in enumerate(entries):
        ET.SubElement(categories, "category", value=value, type="string", label=value or other, symbol=str(index), render="true")
        symbols.append(_line_symbol(str(index), colour, width))
    return _qml(renderer)


def width_class_style(classes: WidthClasses | None) -> str:
    """QML of a crack layer: coloured by the class of the width its standard grades (``classes.graded_column``), from
    yellow for the narrowest class to dark red for the widest, wider classes drawn thicker; one red line without classes."""
    if classes is None:
        return single_line_style()
    steps = np.linspace(0.0, 1.0, len(classes.labels))  # each class's place from the narrowest (0) to the widest (1)
    anchors = np.array(_WIDTH_RAMP, np.float64)
    at = np.linspace(0.0, 1.0, len(anchors))
    colours = [tuple(int(round(np.interp(t, at, anchors[:, band]))) for band in range(3)) for t in steps]
    widths = [round(LINE_MM * (1 + t), 2) for t in steps]
    return categorized_style(classes.graded_column, dict(zip(classes.labels, colours)), widths, other="no class")


def layer_styles_columns(styles: list[tuple[str, str, str]]) -> dict[str, np.ndarray]:
    """The columns of QGIS's ``layer_styles`` table (as QGIS writes them) for ``styles``: (layer, its geometry column, QML)
    each, one default style per layer, named after it; no SLD."""
    count, now = len(styles), np.datetime64(datetime.now(timezone.utc).replace(tzinfo=None), "ms")
    text = {"f_table_catalog": [""] * count, "f_table_schema": [""] * count,
            "f_table_name": [layer for layer, _, _ in styles], "f_geometry_column": [geometry for _, geometry, _ in styles],
            "styleName": [layer for layer, _, _ in styles], "styleQML": [qml for _, _, qml in styles], "styleSLD": [""] * count}
    return {**{name: np.array(values, object) for name, values in text.items()}, "useAsDefault": np.ones(count, bool),
            "description": np.array(["crackseg's default style"] * count, object), "owner": np.array([""] * count, object),
            "ui": np.array([None] * count, object), "update_time": np.full(count, now)}


def _line_symbol(name: str, colour: tuple[int, int, int], width_mm: float) -> ET.Element:
    symbol = ET.Element("symbol", type="line", name=name, alpha="1", clip_to_extent="1", force_rhr="0")
    layer = ET.SubElement(symbol, "layer", {"class": "SimpleLine", "enabled": "1", "locked": "0", "pass": "0"})
    options = ET.SubElement(layer, "Option", type="Map")
    for key, value in {"line_color": ",".join(map(str, (*colour, 255))), "line_width": f"{width_mm:g}", "line_width_unit": "MM",
                       "line_style": "solid", "capstyle": "round", "joinstyle": "round"}.items():
        ET.SubElement(options, "Option", type="QString", name=key, value=value)
    return symbol


def _qml(renderer: ET.Element) -> str:
    root = ET.Element("qgis", version=QGIS_VERSION, styleCategories="Symbology")
    root.append(renderer)
    ET.SubElement(root, "layerGeometryType").text = _LINE_GEOMETRY
    ET.indent(root)
    return f"{_DOCTYPE}\n{ET.tostring(root, encoding='unicode')}\n"
