"""A later visit of synthetic data: reproducible bytes, masks changed as truth.json says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from crackseg.core.errors import InputError
from crackseg.data.later_visit import write_later_visit
from crackseg.data.synth import write_dataset


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _later_visit(tmp_path, seed=7, workers=1):
    if not (tmp_path / "earlier").exists():
        write_dataset(tmp_path / "earlier", count=8, size=(160, 192), seed=12)
    write_later_visit(tmp_path / f"later{seed}-{workers}", tmp_path / "earlier", seed=seed, workers=workers)
    return tmp_path / f"later{seed}-{workers}"


def _mask(path):
    return np.asarray(Image.open(path)) > 127


def test_later_visit_same_seed_gives_identical_bytes(tmp_path):
    a, b, c = _later_visit(tmp_path), _later_visit(tmp_path, workers=2), _later_visit(tmp_path, seed=8)
    assert _files(a) == _files(b)
    assert sorted(_files(a)) == sorted(_files(tmp_path / "earlier")) + [Path("truth.json")]  # the same names, so they pair
    assert all(_files(a)[name] != _files(c)[name] for name in _files(a) if name.suffix == ".jpg")


def test_later_visit_masks_change_as_truth_says(tmp_path):
    later = _later_visit(tmp_path)
    truth = json.loads((later / "truth.json").read_text())
    eight = np.ones((3, 3), bool)
    seen = set()
    for stem, visit in truth.items():
        camera = visit["camera"]
        assert abs(camera["rotation_deg"]) <= 3 and abs(camera["scale"] - 1) <= 0.03 + 1e-9
        # later (col, row, 1) = matrix @ earlier (col, row, 1); affine_transform wants later (row, col) -> earlier
        to_earlier = np.linalg.inv(camera["matrix"])[[1, 0]][:, [1, 0, 2]]

        def seen_later(pixels):
            return ndimage.affine_transform(pixels, to_earlier[:, :2], to_earlier[:, 2], order=0)

        # Cracks as truth.json counts them: mask pixels joined across gaps of up to 2 px.
        now = _mask(later / "masks" / f"{stem}.png")
        pieces = ndimage.label(ndimage.binary_dilation(now, eight), eight)[0] * now
        earlier = _mask(tmp_path / "earlier" / "masks" / f"{stem}.png")
        cracks = ndimage.label(ndimage.binary_dilation(earlier, eight), eight)[0] * earlier
        for crack in visit["cracks"]:
            own = cracks == crack["region"]
            assert own[tuple(crack["earlier_point"])] and own.sum() == crack["pixels"][0]
            own_now = seen_later(own)
            if crack["pixels"][0] < 30 or own_now.sum() < 0.9 * own.sum():  # too small to change; out of view
                continue
            seen |= set(crack["status"].split("+"))
            near = (now & seen_later(ndimage.binary_dilation(own, iterations=2))).sum() / own_now.sum()
            assert near < 0.05 if crack["status"] == "gone" else near > 0.85
            assert (near > 1.2) == ("wider" in crack["status"])
            if "longer" in crack["status"]:
                grown = np.isin(pieces, pieces[own_now & now]) & ~seen_later(ndimage.binary_dilation(earlier, iterations=4))
                assert grown.sum() >= 0.4 * crack["extended_px"] >= 4
        for crack in visit["new"]:
            seen.add("new")
            assert crack["pixels"][1] > 0 and crack["length_px"] >= 12
            row, col = np.rint(crack["later_point"]).astype(int)
            assert now[max(row - 1, 0) : row + 2, max(col - 1, 0) : col + 2].any()
            row, col = crack["earlier_point"]
            assert not earlier[max(row - 3, 0) : row + 4, max(col - 3, 0) : col + 4].any()
    assert seen >= {"unchanged", "gone", "wider", "longer", "new"}, seen


@pytest.mark.parametrize("make", [lambda root: None, lambda root: (root / "images").mkdir(parents=True)])
def test_later_visit_of_a_folder_that_is_not_synth_data_is_one_line(tmp_path, make):
    make(tmp_path / "photos")
    with pytest.raises(InputError, match="photos") as caught:
        write_later_visit(tmp_path / "later", tmp_path / "photos", seed=0)
    assert "\n" not in str(caught.value)
