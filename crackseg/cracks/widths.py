"""Crack sizes in millimetres and width classes: the one conversion of predict's tables, compare's changes
and the crack register."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PX_PER_BAND = 3  # a width is known to about +-1 px: a band spanning fewer pixels cannot be told from its neighbours
MM_DIGITS = 4  # decimals of a size in mm as the tables write it, and as a width is classed


def in_mm(measures: dict, mm_per_px: float, digits: int | None = MM_DIGITS) -> dict:
    """The mm columns of px columns, the one conversion of predict's tables, compare's changes and the register:
    ``length_mm``, ``mean_width_mm``, ``max_width_mm`` from the ``*_px`` keys of ``measures`` that are present (None
    stays None), ``area_mm2`` from ``area_px``; rounded to ``digits`` decimals (None: not rounded). Give it the
    measures as found, not rounded px: every table then writes the same mm for a crack."""
    factors = {f"{key}_mm": (f"{key}_px", mm_per_px) for key in ("length", "mean_width", "max_width")} | {"area_mm2": ("area_px", mm_per_px**2)}
    sizes = {name: None if measures[px] is None else measures[px] * factor for name, (px, factor) in factors.items() if px in measures}
    return sizes if digits is None else {name: None if mm is None else round(mm, digits) for name, mm in sizes.items()}


@dataclass(frozen=True)
class WidthClasses:
    """Width bands in mm as a standard draws them: its class names, which side of each edge a width on it falls,
    and which width of a crack it grades (``max``: the worst width along the crack; ``mean``: its mean width)."""

    name: str
    edges_mm: tuple[float, ...]
    labels: tuple[str, ...]  # one more than edges
    upper: tuple[bool, ...] = ()  # per edge: a width equal to it goes to the band above; empty: all go below
    graded: str = "max"
    title: str = ""  # the standard, for legends and docs

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.edges_mm) + 1 or len(self.upper) not in (0, len(self.edges_mm)) \
                or self.graded not in ("max", "mean"):
            raise ValueError(f"width classes {self.name}: one label more than edges, a side per edge, graded max or mean")

    @classmethod
    def parse(cls, text: str) -> WidthClasses:
        """A preset name (see ``WIDTH_CLASS_PRESETS``) or increasing edges in mm such as ``0.1,0.2,0.3,1.0``."""
        if text in WIDTH_CLASS_PRESETS:
            return WIDTH_CLASS_PRESETS[text]
        try:
            edges = tuple(float(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"must be {', '.join(WIDTH_CLASS_PRESETS)} or increasing widths in mm like 0.1,0.2,0.3, got {text!r}") from None
        if not edges or any(not math.isfinite(e) or e <= 0 for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"widths must be positive and increasing (mm), got {text!r}")
        return cls("custom", edges, _band_labels(edges))

    @property
    def flag_value(self) -> str:
        """What ``--width-classes`` takes to give these classes: the preset's name, or the edges."""
        return ",".join(f"{edge:g}" for edge in self.edges_mm) if self.name == "custom" else self.name

    @property
    def graded_column(self) -> str:
        """The cracks.csv column whose class this standard grades: ``max_width_class`` or ``mean_width_class``."""
        return f"{self.graded}_width_class"

    @property
    def described(self) -> str:
        """The name with its standard, for warnings and help: ``mbei-rc (AASHTO MBEI, reinforced concrete)``."""
        return f"{self.name} ({self.title})" if self.title else self.name

    def as_dict(self) -> dict:
        """The classes as predict's and compare's summary.json give them."""
        return {"name": self.name, "title": self.title, "edges_mm": list(self.edges_mm), "labels": list(self.labels),
                "ranges_mm": self.ranges(), "graded": self.graded, "by": f"{self.graded} width"}

    def grade(self, sizes: dict, suffix: str = "") -> str:
        """The class of the width this standard grades, read from ``sizes[f"{graded}_width_mm{suffix}"]`` (suffix: compare's
        ``_before`` / ``_after``)."""
        return self.classify(sizes[f"{self.graded}_width_mm{suffix}"])

    def classify(self, width_mm: float) -> str:
        """The class of a width in mm, as the tables write it (rounded to MM_DIGITS decimals, so a width written as an
        edge is on that edge whichever table or register classes it); a width on an edge falls on the side its standard
        puts it (``upper``)."""
        width_mm = round(width_mm, MM_DIGITS)
        below = int(np.searchsorted(self.edges_mm, width_mm, side="left"))
        on_edge = below < len(self.edges_mm) and width_mm == self.edges_mm[below]
        return self.labels[below + int(on_edge and self._upper()[below])]

    def ranges(self) -> dict[str, str]:
        """Each class's widths ``w`` in mm with the side of each edge: ``{"CS1": "w < 0.3048", "CS2": "0.3048 <= w <= 1.27", ...}``."""
        edges, upper = self.edges_mm, self._upper()
        under = [f"{'<' if up else '<='} {edge:g}" for edge, up in zip(edges, upper)]  # w under each edge
        over = [f"{edge:g} {'<=' if up else '<'}" for edge, up in zip(edges, upper)]  # w over each edge
        texts = [f"w {under[0]}", *(f"{low} w {high}" for low, high in zip(over, under[1:])), f"w {'>=' if upper[-1] else '>'} {edges[-1]:g}"]
        return dict(zip(self.labels, texts))

    def narrowest_band_mm(self) -> float:
        """The narrowest band's width (the first band runs from 0)."""
        return float(min(np.diff((0.0, *self.edges_mm))))

    def coarsest_px_size_mm(self) -> float:
        """The largest pixel size (mm) at which the narrowest band still spans :data:`PX_PER_BAND` pixels."""
        return self.narrowest_band_mm() / PX_PER_BAND

    def _upper(self) -> tuple[bool, ...]:
        return self.upper or (False,) * len(self.edges_mm)


def _band_labels(edges: tuple[float, ...]) -> tuple[str, ...]:
    text = [f"{edge:g}" for edge in edges]
    return (f"<={text[0]}", *(f"{a}-{b}" for a, b in zip(text, text[1:])), f">{text[-1]}")


WIDTH_CLASS_PRESETS = {preset.name: preset for preset in (
    # BRE Digest 251 damage categories for masonry walls: 0 hairline, 1 fine, 2 easily filled, 3 opening up,
    # 4 extensive, 5 structural ("up to 0.1 mm", "up to 1 mm", ...: an edge belongs to the band below).
    WidthClasses("bre251", (0.1, 1.0, 5.0, 15.0, 25.0), ("0", "1", "2", "3", "4", "5"), title="BRE Digest 251"),
    # ACI 224R tolerable widths by exposure (water-retaining, seawater, deicing chemicals, humidity / soil, dry air):
    # a crack is tolerable in the exposures whose width it does not exceed.
    WidthClasses("aci224", (0.10, 0.15, 0.18, 0.30, 0.41), _band_labels((0.10, 0.15, 0.18, 0.30, 0.41)), title="ACI 224R"),
    # AASHTO Manual for Bridge Element Inspection, cracking of reinforced concrete: CS1 "less than 0.012 in."
    # (0.3048 mm), CS2 "0.012-0.05 in." (to 1.27 mm), CS3 "greater than 0.05 in."; graded by the worst crack.
    WidthClasses("mbei-rc", (0.3048, 1.27), ("CS1", "CS2", "CS3"), (True, False),
                 title="AASHTO MBEI, reinforced concrete"),
    # The same manual, prestressed concrete: CS1 "less than 0.004 in.", CS2 "0.004-0.009 in.", CS3 "greater than 0.009 in."
    # (0.1016 and 0.2286 mm).
    WidthClasses("mbei-psc", (0.1016, 0.2286), ("CS1", "CS2", "CS3"), (True, False),
                 title="AASHTO MBEI, prestressed concrete"),
    # EN 1992-1-1 Table 7.1N, recommended w_max of reinforced members: 0.3 mm (XC2-XC4, XD, XS), 0.4 mm (X0, XC1).
    WidthClasses("ec2", (0.3, 0.4), ("<=0.3", "0.3-0.4", ">0.4"), title="EN 1992-1-1 Table 7.1N, reinforced"),
    # The same table, prestressed members with bonded tendons: w_max 0.2 mm.
    WidthClasses("ec2-psc", (0.2,), ("<=0.2", ">0.2"), title="EN 1992-1-1 Table 7.1N, prestressed"),
    # ASTM D6433 asphalt longitudinal and transverse cracking by mean width: L "< 10 mm", M ">= 10 mm and < 75 mm",
    # H "> 75 mm" (75 mm itself, in neither, goes to H).
    WidthClasses("d6433-ac", (10.0, 75.0), ("L", "M", "H"), (True, True), "mean", "ASTM D6433, asphalt"),
    # ASTM D6433 jointed concrete linear cracking by mean width: L "< 13 mm", M "13-50 mm", H "> 50 mm": as MBEI's
    # "0.012-0.05 in.", both edges are M's.
    WidthClasses("d6433-pcc", (13.0, 50.0), ("L", "M", "H"), (True, False), "mean", "ASTM D6433, jointed concrete"),
)}
