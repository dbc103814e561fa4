"""Crack sizes in millimetres and width classes: the one conversion of predict's tables, compare's changes
and the crack register."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def in_mm(measures: dict, mm_per_px: float, digits: int | None = 4) -> dict:
    """The mm columns of px columns, the one conversion of predict's tables, compare's changes and the register:
    ``length_mm``, ``mean_width_mm``, ``max_width_mm`` from the ``*_px`` keys of ``measures`` that are present (None
    stays None), ``area_mm2`` from ``area_px``; rounded to ``digits`` decimals (None: not rounded)."""
    factors = {f"{key}_mm": (f"{key}_px", mm_per_px) for key in ("length", "mean_width", "max_width")} | {"area_mm2": ("area_px", mm_per_px**2)}
    sizes = {name: None if measures[px] is None else measures[px] * factor for name, (px, factor) in factors.items() if px in measures}
    return sizes if digits is None else {name: None if mm is None else round(mm, digits) for name, mm in sizes.items()}


WIDTH_CLASS_PRESETS = {
    # BRE Digest 251 damage categories for masonry walls, by crack width in mm: 0 hairline, 1 fine,
    # 2 easily filled, 3 opening up, 4 extensive, 5 structural.
    "bre251": ((0.1, 1.0, 5.0, 15.0, 25.0), ("0", "1", "2", "3", "4", "5")),
    # ACI 224R tolerable widths by exposure (water-retaining, seawater, deicing chemicals,
    # humidity / soil, dry air): a crack is tolerable in the exposures whose width it does not exceed.
    "aci224": ((0.10, 0.15, 0.18, 0.30, 0.41), None),
}


@dataclass(frozen=True)
class WidthClasses:
    """Width bands in mm; a width on an edge goes to the lower band."""

    name: str
    edges_mm: tuple[float, ...]
    labels: tuple[str, ...]  # one more than edges

    @classmethod
    def parse(cls, text: str) -> WidthClasses:
        """``bre251``, ``aci224``, or increasing edges in mm such as ``0.1,0.2,0.3,1.0``."""
        if text in WIDTH_CLASS_PRESETS:
            edges, labels = WIDTH_CLASS_PRESETS[text]
            return cls(text, edges, labels or _band_labels(edges))
        try:
            edges = tuple(float(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"must be {', '.join(WIDTH_CLASS_PRESETS)} or increasing widths in mm like 0.1,0.2,0.3, got {text!r}") from None
        if not edges or any(not math.isfinite(e) or e <= 0 for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"widths must be positive and increasing (mm), got {text!r}")
        return cls("custom", edges, _band_labels(edges))

    def classify(self, width_mm: float) -> str:
        return self.labels[int(np.searchsorted(self.edges_mm, width_mm, side="left"))]

    def narrowest_band_mm(self) -> float:
        """The narrowest band's width (the first band runs from 0)."""
        return float(min(np.diff((0.0, *self.edges_mm))))


def _band_labels(edges: tuple[float, ...]) -> tuple[str, ...]:
    text = [f"{edge:g}" for edge in edges]
    return (f"<={text[0]}", *(f"{a}-{b}" for a, b in zip(text, text[1:])), f">{text[-1]}")
