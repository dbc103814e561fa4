"""Width classes in mm: the presets, custom edges, a width on an edge, bad text refused."""

from __future__ import annotations

import pytest

from crackseg.cracks.widths import WidthClasses


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
