"""Rasters predicted by windows (crackseg/prediction/streamed.py): the same pixels as in memory, parts predicted by
several processes and joined, which TIFFs are streamed, masks measured by bands."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch import nn

from crackseg.model.options import InferenceOptions
from crackseg.data.rasters import RasterSource
from crackseg.model.inference import Predictor, part_rows, tile_starts
from crackseg.model.networks import CrackSegModel

rasterio = pytest.importorskip("rasterio")

from conftest import pavement, predict_tiled, read_mask, write_geotiff  # noqa: E402


def _context_model() -> CrackSegModel:
    """A small random CNN: its output depends on a neighbourhood, so tile seams and blending matter."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 5, padding=2), nn.ReLU(), nn.Conv2d(4, 1, 5, padding=2))
    return CrackSegModel(net, "unet", "tiny-cnn", size_divisor=1).eval()


def test_streamed_probabilities_are_the_in_memory_bits_and_hold_only_the_overlap_rows(tmp_path):
    pixels = pavement(2000, 3000)
    write_geotiff(tmp_path / "ortho.tif", pixels)
    model = _context_model()
    predictor = Predictor(model, torch.device("cpu"), InferenceOptions(tile=256, overlap=32, batch_size=3))
    streamed = torch.full((2000, 3000), -1.0)
    with RasterSource(tmp_path / "ortho.tif") as source:
        for top, left, prob, valid in predictor.blocks(source.read, source.height, source.width):
            assert (streamed[top : top + prob.shape[0], left : left + prob.shape[1]] == -1).all() and valid.all()
            streamed[top : top + prob.shape[0], left : left + prob.shape[1]] = prob
    ((_, whole),) = list(Predictor(model, torch.device("cpu"), InferenceOptions(tile=256, overlap=32)).probabilities([(0, torch.from_numpy(pixels))]))
    assert torch.equal(streamed, whole)  # every pixel written once, and the same bits
    # Weighted sums and weights of one tile, and of the rows a tile row shares with the rows above and
    # below: 38 each, the overlap of tiles spread evenly (9 tile rows, 218 apart, the last flush with the bottom).
    assert tile_starts(2000, 256, 32) == list(range(0, 1745, 218))
    assert predictor.floats_held == 2 * ((38 + 38) * 3000 + 256 * 256)


def test_pixels_outside_the_survey_reach_the_model_as_grey_whatever_they_hold(tmp_path):
    """Black under nodata drew cracks along the survey's edge (docs/predict.md): the model sees mid-grey there."""
    predictor = Predictor(_context_model(), torch.device("cpu"), InferenceOptions(tile=128, overlap=16))
    outside = np.zeros((1, 300, 400), np.uint8)
    outside[0, :, :150] = 255
    outputs = []
    for hidden in (0, 255, 128):
        pixels = pavement(300, 400)
        pixels[:, :, :150] = hidden
        alpha = np.where(outside[0] > 0, 0, 255).astype(np.uint8)[None]
        write_geotiff(tmp_path / f"{hidden}.tif", np.concatenate([pixels, alpha]), photometric="RGB", alpha="YES")
        with RasterSource(tmp_path / f"{hidden}.tif") as source:
            read, valid = source.read(0, 0, 300, 400)
            assert (read[:, :, :150] == 128).all() and np.array_equal(read[:, :, 150:].numpy(), pavement(300, 400)[:, :, 150:])
            assert not valid[:, :150].any() and valid[:, 150:].all()
            outputs.append({(top, left): prob for top, left, prob, _ in predictor.blocks(source.read, 300, 400)})
    assert all(torch.equal(prob, outputs[2][key]) for other in outputs[:2] for key, prob in other.items())


@pytest.mark.parametrize("overlap", [32, 160])  # 160: each row of pixels lies in up to three tile rows
def test_parts_of_a_raster_are_the_bits_of_the_whole(tmp_path, overlap):
    pixels = pavement(1100, 700)
    write_geotiff(tmp_path / "ortho.tif", pixels)
    predictor = Predictor(_context_model(), torch.device("cpu"), InferenceOptions(tile=256, overlap=overlap))
    with RasterSource(tmp_path / "ortho.tif") as source:
        whole = {(top, left): prob for top, left, prob, _ in predictor.blocks(source.read, source.height, source.width)}
        for count in (2, 3, 40):  # 40: more processes than tile rows, most of them with nothing to do
            parts = [list(predictor.blocks(source.read, source.height, source.width, (index, count))) for index in range(count)]
            assert [(top, left) for part in parts for top, left, _, _ in part] == list(whole)
            assert all(torch.equal(prob, whole[(top, left)]) for part in parts for top, left, prob, _ in part)
            spans = [part_rows(1100, 256, overlap, (index, count)) for index in range(count)]
            assert spans[0][0] == 0 and spans[-1][1] == 1100 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_joined_parts_and_their_pixel_counts_equal_the_whole(tmp_path):
    from crackseg.prediction.outputs import PredictionsFolder
    from crackseg.prediction.streamed import RasterRun, merge_parts, predict_raster

    pixels = pavement(1100, 700)
    pixels[:, 900:, :] = 0
    write_geotiff(tmp_path / "ortho.tif", pixels, nodata=0)
    predictor = Predictor(_context_model(), torch.device("cpu"), InferenceOptions(tile=256, overlap=32))
    run = RasterRun(predictor, 0.5, PredictionsFolder(tmp_path), save_prob=16)
    whole = [tmp_path / "whole" / "mask.tif", tmp_path / "whole" / "prob.tif"]
    joined = [tmp_path / "joined" / "mask.tif", tmp_path / "joined" / "prob.tif"]
    with RasterSource(tmp_path / "ortho.tif") as source:
        counts = predict_raster(source, whole, run, progress=False)
        parts = [predict_raster(source, joined, run, part=(index, 3), progress=False) for index in range(3)]
        merge_parts(source, joined, 256, 32, 3)
    mask, valid, _ = read_mask(whole[0])
    assert counts == tuple(map(sum, zip(*parts))) == (int((mask > 0).sum()), int((valid > 0).sum())) and 0 < counts[0] < counts[1] < 1100 * 700
    for a, b in zip(whole, joined):
        assert np.array_equal(read_mask(a)[0], read_mask(b)[0]) and np.array_equal(read_mask(a)[1], read_mask(b)[1])
    assert sorted(p.name for p in (tmp_path / "joined").iterdir()) == ["mask.tif", "prob.tif"]


@pytest.mark.slow
def test_processes_sharing_a_raster_write_what_one_process_writes(tmp_path, dark_checkpoint):
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(1300, 900))
    common = ["--model", str(dark_checkpoint), str(tmp_path / "in"), "--save-prob", "16", "--vectors", "geojson", "--overviews"]
    assert predict_tiled(*common, "--out", tmp_path / "one") == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")} | {"PYTHON": sys.executable}
    launch = Path(__file__).resolve().parents[2] / "launch.sh"
    result = subprocess.run(["bash", str(launch), "--nproc", "2", "predict", *common, "--out", str(tmp_path / "two"), "--device", "cpu",
                             "--workers", "0", "--tile", "256", "--overlap", "32"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for kind in ("masks", "probs"):
        with rasterio.open(tmp_path / "one" / kind / "ortho.tif") as one, rasterio.open(tmp_path / "two" / kind / "ortho.tif") as two:
            assert np.array_equal(one.read(), two.read()) and np.array_equal(one.dataset_mask(), two.dataset_mask())
            assert (one.crs, one.transform, one.overviews(1)) == (two.crs, two.transform, two.overviews(1)) and two.overviews(1)
    for table in ("predictions.csv", "cracks.csv"):
        assert (tmp_path / "one" / table).read_text().replace("/one/", "/") == (tmp_path / "two" / table).read_text().replace("/two/", "/")
    assert (tmp_path / "one" / "vectors" / "ortho.geojson").read_text() == (tmp_path / "two" / "vectors" / "ortho.geojson").read_text()
    assert sorted(p.name for p in (tmp_path / "two").rglob("*") if p.name.startswith(".")) == []


def test_rasters_without_the_geo_extra_are_one_line_and_plain_tiffs_read_as_photos(tmp_path, dark_checkpoint, monkeypatch, capsys):
    from PIL import Image

    (tmp_path / "geo").mkdir()
    write_geotiff(tmp_path / "geo" / "ortho.tif", pavement(100, 100))
    (tmp_path / "plain").mkdir()
    Image.fromarray(pavement(100, 100).transpose(1, 2, 0)).save(tmp_path / "plain" / "scan.tif")
    monkeypatch.setitem(sys.modules, "rasterio", None)  # makes `import rasterio` fail
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "geo", "--out", tmp_path / "out") == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "ortho.tif" in error and "pip install 'crackseg[geo]'" in error
    assert not (tmp_path / "out" / "masks").exists()
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "plain", "--out", tmp_path / "out2", "--no-measure") == 0
    assert (tmp_path / "out2" / "masks" / "scan.png").exists()


def test_cracks_across_bands_are_measured_as_on_the_whole_mask(tmp_path):
    from skimage.draw import line

    from crackseg.cracks.measure import find_cracks
    from crackseg.prediction.streamed import summarize_raster

    mask = np.zeros((700, 500), bool)
    for (r0, c0, r1, c1), width in [((5, 10, 690, 400), 3), ((20, 450, 680, 470), 5), ((640, 5, 690, 200), 1)]:
        rows, cols = line(r0, c0, r1, c1)
        for offset in range(width):
            mask[rows, np.minimum(cols + offset, 499)] = True
    mask[400:406, 455:480] = False  # a 6 px gap in the second crack, on a band border below
    mask[600:603, 100:103] = True  # a speck, shorter than the minimum length
    write_geotiff(tmp_path / "mask.tif", (mask * np.uint8(255))[None])
    expected = find_cracks(mask, join_gap=10, min_length=10)[1]
    for band_rows in (64, 100, 700):  # 64 and 100 rows: every crack crosses several bands, the gap one too
        counts, cracks, _ = summarize_raster(tmp_path / "mask.tif", True, join_gap=10, min_length=10, band_pixels=band_rows * 500)
        assert counts["area_px"] == mask.sum()
        assert len(cracks) == len(expected) == 3, band_rows
        for got, want in zip(cracks, expected):
            assert (got.id, got.area_px, got.bbox, got.fragments) == (want.id, want.area_px, want.bbox, want.fragments), band_rows
            assert got.length_px == pytest.approx(want.length_px, rel=1e-9)
            assert (got.max_width_px, got.mean_width_px) == pytest.approx((want.max_width_px, want.mean_width_px), rel=1e-9)


def test_a_raster_mask_says_what_made_it_and_skip_existing_keeps_it_only_then(tmp_path, dark_checkpoint, capsys):
    import json

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(300, 400))
    common = ["--model", str(dark_checkpoint), str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--save-prob", "8"]
    assert predict_tiled(*common) == 0
    mask = tmp_path / "out" / "masks" / "ortho.tif"
    with rasterio.open(mask) as saved:
        made_with = json.loads(saved.tags()["crackseg_made_with"])
    assert (made_with["tile"], made_with["overlap"], made_with["tta"]) == (256, 32, "none") and "sha256" in made_with["model"]
    written = mask.read_bytes()
    assert predict_tiled(*common, "--skip-existing") == 0
    assert mask.read_bytes() == written and "skipped" in (tmp_path / "out" / "predictions.csv").read_text()
    capsys.readouterr()
    assert predict_tiled(*common, "--skip-existing", "--threshold", "0.99") == 2
    assert f"{mask}: an earlier run made it with threshold {made_with['threshold']}, not 0.99" in capsys.readouterr().err
