"""The measurement flags that predict and compare share, declared once; each command gives them its own help, since
what it does with the values differs. The crack defaults are lengths with units."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from crackseg.core.options import PX_SIZE, Length, Options, option
from crackseg.cracks.vectors import FORMATS as VECTOR_FORMATS
from crackseg.cracks.widths import WIDTH_CLASS_PRESETS, WidthClasses

JOIN_GAP = Length(10.0, "px")  # gaps within one crack that predict bridges
MIN_LENGTH = Length(10.0, "px")  # cracks shorter than this are left out of predict's tables


def _width_classes(text: str) -> str:
    """A preset of :data:`~crackseg.cracks.widths.WIDTH_CLASS_PRESETS` or increasing edges in mm, checked by their owner
    and kept as text."""
    WidthClasses.parse(text)
    return text


def width_classes_help(what: str) -> str:
    """--width-classes' help: ``what`` the command does with the classes, then every preset with its standard, edges and
    graded width, from the presets themselves."""
    presets = ", ".join(f"{name} ({preset.title}: {', '.join(f'{edge:g}' for edge in preset.edges_mm)} mm, {preset.graded} width)"
                        for name, preset in WIDTH_CLASS_PRESETS.items())
    return (f"{what}: {presets}; or your own edges in mm, e.g. 0.1,0.2,0.3,1.0 (max width, a width on an edge in the lower "
            "class). docs/predict.md gives each standard's classes and source; needs a pixel size, see --px-size")


@dataclass(frozen=True)
class Scale(Options):
    """The pixel size that puts measurements in mm, and the width classes that need it; each command's help says what
    it does with them (:func:`crackseg.core.options.group`'s ``helps``)."""

    px_size: float | None = option(None, "pixel size in mm", unit="mm", valid=PX_SIZE)
    width_classes: str | None = option(None, width_classes_help("class each crack by its width"), parse=_width_classes)

    def classes(self) -> WidthClasses | None:
        return None if self.width_classes is None else WidthClasses.parse(self.width_classes)


def vectors(help: str) -> dataclasses.Field:
    """--vectors: a vector format of :data:`crackseg.cracks.vectors.FORMATS`."""
    return option(None, help, choices=VECTOR_FORMATS)


def length(default: Length, help: str) -> dataclasses.Field:
    """A length in px or mm (mm need a pixel size)."""
    return option(default, help, unit="px or mm", parse=Length.parse)
