"""crackseg export --format deepness: the metadata QGIS's Deepness plugin reads, and the model run as Deepness runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import crackseg
from conftest import cli_result
from crackseg.model.checkpoint import save_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepness")
    torch.manual_seed(0)
    model = crackseg.build_model("mobilenet_v2", scaling="tf")
    model.threshold = 0.42
    save_model(model, folder / "model.pt")
    return folder / "model.pt"


def _deepness_run(path, tiles: np.ndarray) -> tuple[np.ndarray, dict]:
    """What Deepness does with a model file: read its metadata as JSON, check its declared shapes, scale (N, H, W, 3)
    uint8 tiles to [0, 1], standardize them, NCHW float32 in, the one output back."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = {key: json.loads(value) for key, value in session.get_modelmeta().custom_metadata_map.items()
            if key not in ("format", "crackseg_version", "arch", "encoder")}
    (model_input,), (output,) = session.get_inputs(), session.get_outputs()
    assert len(output.shape) == 4 and output.shape[2] == output.shape[3]  # Deepness refuses anything else
    assert model_input.shape[-2:] == [meta["tile_size"]] * 2 and model_input.type == "tensor(float)"
    scaled = np.float32(tiles * 1.0 / 255.0)
    scaled = (scaled - np.array(meta["standardization_mean"])) / np.array(meta["standardization_std"])
    probabilities = session.run(None, {model_input.name: scaled.transpose(0, 3, 1, 2).astype(np.float32)})[0]
    return probabilities, meta


def test_deepness_reads_the_metadata_it_needs(tmp_path, model_file):
    assert cli_result(["export", model_file, "--format", "deepness", "--out", tmp_path / "m.onnx", "--tile", "256",
                       "--tile-overlap", "15", "--px-size", "3"]) == (0, "")
    model = crackseg.load_model(model_file)
    _, meta = _deepness_run(tmp_path / "m.onnx", np.zeros((1, 256, 256, 3), np.uint8))
    assert meta["model_type"] == "Segmentor" and meta["class_names"] == {"0": "background", "1": "crack"}
    assert meta["tiles_size"] == meta["tile_size"] == 256 and meta["tiles_overlap"] == 15
    assert meta["seg_thresh"] == pytest.approx(0.42) and meta["resolution"] == pytest.approx(0.3)  # cm per px
    assert meta["standardization_mean"] == pytest.approx(model.mean.flatten().tolist())
    assert meta["standardization_std"] == pytest.approx(model.std.flatten().tolist())
    graph = onnx.load(tmp_path / "m.onnx")
    onnx.checker.check_model(graph)


def test_the_model_as_deepness_feeds_it_equals_crackseg(tmp_path, model_file):
    assert cli_result(["export", model_file, "--format", "deepness", "--out", tmp_path / "m.onnx", "--tile", "128"])[0] == 0
    tiles = np.random.default_rng(0).integers(0, 256, (3, 128, 128, 3), dtype=np.uint8)
    probabilities, meta = _deepness_run(tmp_path / "m.onnx", tiles)
    assert "resolution" not in meta  # not known unless given
    with torch.no_grad():
        expected = torch.sigmoid(crackseg.load_model(model_file)(torch.from_numpy(tiles).permute(0, 3, 1, 2))).numpy()
    assert probabilities.shape == (3, 1, 128, 128) and np.abs(probabilities - expected).max() < 1e-4


@pytest.mark.parametrize("argv, message", [
    (["--format", "deepness", "--tile", "100"], "--tile 100 px is not a multiple of 32"),
    (["--format", "onnx", "--tile", "256"], "are for --format deepness"),
    (["--format", "deepness", "--tile-overlap", "95"], "--tile-overlap: must be in [0, 90]"),
])
def test_tiles_it_cannot_take_are_one_line_errors(tmp_path, model_file, argv, message):
    code, err = cli_result(["export", model_file, *argv, "--out", tmp_path / "m.onnx"])
    assert code == 2 and message in err and not (tmp_path / "m.onnx").exists()


def test_crackseg_predict_refuses_a_deepness_file_by_name(tmp_path, model_file, synth_root):
    cli_result(["export", model_file, "--format", "deepness", "--out", tmp_path / "m.onnx"])
    code, err = cli_result(["predict", "--checkpoint", tmp_path / "m.onnx", synth_root / "images", "--out", tmp_path / "p"])
    assert code == 2 and "exported for QGIS's Deepness plugin" in err
