"""crackseg export --format onnx for QGIS's Deepness plugin: the metadata it reads, and the model run as it runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import crackseg
from conftest import cli_result, isolated
from crackseg.model.checkpoint import save_model

CRACKSEG_KEYS = ("format", "crackseg_version", "arch", "encoder", "size_divisor", "threshold", "input", "output", "sha256", "tile")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepness")
    torch.manual_seed(0)
    model = crackseg.build_model("mobilenet_v2", scaling="tf")
    model.threshold = 0.42
    save_model(model, folder / "model.pt")
    return folder / "model.pt"


def _deepness_run(path, tiles: np.ndarray, fixed: bool = True) -> tuple[np.ndarray, dict]:
    """What Deepness does with a model file: read its metadata as JSON, check its declared shapes (its tile is the
    input's side), scale (N, H, W, 3) uint8 tiles to [0, 1], standardize them, NCHW float32 in, the one output back."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = {key: json.loads(value) for key, value in session.get_modelmeta().custom_metadata_map.items()
            if key not in CRACKSEG_KEYS}
    (model_input,), (output,) = session.get_inputs(), session.get_outputs()
    assert model_input.type == "tensor(float)" and len(output.shape) == 4
    if fixed:  # Deepness reads the tile from the declared shape and refuses an output that is not square
        assert model_input.shape[-2:] == [meta["tile_size"]] * 2 and output.shape[2] == output.shape[3] == meta["tile_size"]
    scaled = np.float32(tiles * 1.0 / 255.0)
    scaled = (scaled - np.array(meta["standardization_mean"])) / np.array(meta["standardization_std"])
    probabilities = session.run(None, {model_input.name: scaled.transpose(0, 3, 1, 2).astype(np.float32)})[0]
    return probabilities, meta


def _deepness_class_map(probabilities: np.ndarray, meta: dict) -> np.ndarray:
    """The crack layer Deepness makes: cut at ``seg_thresh``, then its "remove small segment areas" step, a median
    filter of an odd size from ``seg_small_segment`` (ticked with 9 px when a file does not say)."""
    from scipy.ndimage import median_filter

    size = meta.get("seg_small_segment", 9) // 2 * 2 + 1
    class_map = (probabilities[:, 0] > meta["seg_thresh"]).astype(np.uint8)
    return np.stack([median_filter(tile, size=size, mode="nearest") for tile in class_map])


def _crackseg_probabilities(model_file, tiles: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(crackseg.load_model(model_file)(torch.from_numpy(tiles).permute(0, 3, 1, 2))).numpy()


@isolated
def test_the_onnx_export_carries_what_deepness_reads(tmp_path, model_file):
    import onnx

    assert cli_result(["export", model_file, "--format", "onnx", "--out", tmp_path / "m.onnx", "--tile", "256",
                       "--tile-overlap", "15", "--px-size", "3"]) == (0, "")
    _, meta = _deepness_run(tmp_path / "m.onnx", np.zeros((1, 256, 256, 3), np.uint8))
    assert meta["model_type"] == "Segmentor" and meta["class_names"] == {"0": "background", "1": "crack"}
    assert meta["tiles_size"] == meta["tile_size"] == 256 and meta["tiles_overlap"] == 15
    assert meta["seg_thresh"] == pytest.approx(0.42) and meta["resolution"] == pytest.approx(0.3)  # cm per px
    assert meta["seg_small_segment"] == 0  # no median filter over thin cracks
    assert meta["standardization_mean"] == [0, 0, 0] and meta["standardization_std"] == [1, 1, 1]  # scaling in the graph
    onnx.checker.check_model(onnx.load(tmp_path / "m.onnx"))


@isolated
def test_the_model_as_deepness_feeds_it_equals_crackseg(tmp_path, model_file):
    """Probabilities and the crack layer: a threshold that marks a tenth of the pixels leaves thin specks, which
    Deepness's default median filter would erase."""
    tiles = np.random.default_rng(0).integers(0, 256, (3, 128, 128, 3), dtype=np.uint8)
    model = crackseg.load_model(model_file)
    model.threshold = float(np.quantile(_crackseg_probabilities(model_file, tiles), 0.9))
    save_model(model, tmp_path / "specks.pt")
    assert cli_result(["export", tmp_path / "specks.pt", "--format", "onnx", "--out", tmp_path / "m.onnx", "--tile", "128"])[0] == 0
    probabilities, meta = _deepness_run(tmp_path / "m.onnx", tiles)
    assert "resolution" not in meta  # not known unless given
    assert probabilities.shape == (3, 1, 128, 128)
    expected = _crackseg_probabilities(model_file, tiles)
    assert np.abs(probabilities - expected).max() < 1e-4
    sure = np.abs(expected[:, 0] - meta["seg_thresh"]) > 1e-4  # pixels the two runtimes may cut either way left out
    assert (_deepness_class_map(probabilities, meta) == (expected[:, 0] > meta["seg_thresh"]))[sure].all()


@isolated
def test_a_plain_onnx_export_states_deepness_s_tile_and_runs_its_tiles(tmp_path, model_file):
    """Without --tile the file takes any size (crackseg's runtimes need that) and states 512 px tiles for Deepness."""
    assert cli_result(["export", model_file, "--format", "onnx", "--out", tmp_path / "m.onnx"])[0] == 0
    tiles = np.random.default_rng(1).integers(0, 256, (2, 512, 512, 3), dtype=np.uint8)
    probabilities, meta = _deepness_run(tmp_path / "m.onnx", tiles, fixed=False)
    assert meta["model_type"] == "Segmentor" and meta["tiles_size"] == 512 and meta["tiles_overlap"] == 20
    assert np.abs(probabilities - _crackseg_probabilities(model_file, tiles)).max() < 1e-4


@pytest.mark.parametrize("argv, message", [
    (["--format", "onnx", "--tile", "100"], "--tile 100 px is not a multiple of 32"),
    (["--format", "openvino", "--tile", "256"], "are for --format onnx (QGIS's Deepness plugin), not openvino"),
    (["--format", "onnx", "--tile-overlap", "95"], "--tile-overlap: must be in [0, 90]"),
    (["--format", "onnx", "--tile", "100000"], "--tile: must be in [1, 99999]"),  # Deepness's tile field ends there
    (["--format", "onnx", "--px-size", "0.04"], "reads 0.004 cm as 0, which it divides by"),
])
def test_tiles_it_cannot_take_are_one_line_errors(tmp_path, model_file, argv, message):
    out = tmp_path / ("m.xml" if "openvino" in argv else "m.onnx")
    code, err = cli_result(["export", model_file, *argv, "--out", out])
    assert code == 2 and message in err and err.count("\n") == 1 and not out.exists()


@isolated
def test_crackseg_predict_refuses_a_fixed_tile_file_by_name(tmp_path, model_file, synth_root):
    assert cli_result(["export", model_file, "--format", "onnx", "--tile", "128", "--out", tmp_path / "m.onnx"])[0] == 0
    code, err = cli_result(["predict", "--checkpoint", tmp_path / "m.onnx", synth_root / "images", "--out", tmp_path / "p"])
    assert code == 2 and "exported for QGIS's Deepness plugin, for 128 px tiles only" in err and not (tmp_path / "p").exists()


def test_an_onnx_export_is_an_onnx_file(tmp_path, model_file):
    """predict picks the runtime by the suffix: an ONNX file named .xml would be read as OpenVINO's and refused there."""
    code, err = cli_result(["export", model_file, "--format", "onnx", "--out", tmp_path / "m.xml"])
    assert code == 2 and "an ONNX model is an .onnx file; e.g. --out" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


@isolated
def test_a_resolution_deepness_rounds_is_said_and_the_exact_one_stored(tmp_path, model_file):
    """Deepness shows the resolution in cm per pixel to two decimals: 0.025 becomes 0.03."""
    code, err = cli_result(["export", model_file, "--format", "onnx", "--out", tmp_path / "m.onnx", "--tile", "64",
                            "--px-size", "0.25"])
    assert code == 0 and err.count("\n") == 1
    assert "will run rasters at 0.03 cm, not 0.025 cm per pixel (20% coarser than the training photos)" in err
    _, meta = _deepness_run(tmp_path / "m.onnx", np.zeros((1, 64, 64, 3), np.uint8))
    assert meta["resolution"] == pytest.approx(0.025)
    code, err = cli_result(["export", model_file, "--format", "onnx", "--out", tmp_path / "m.onnx", "--px-size", "0.25"])
    assert code == 2 and err.count("\n") == 1 and "already exists" in err, err  # no warning for an export refused


def test_a_large_tile_is_declared_not_traced(tmp_path, model_file):
    """The graph is traced on a small image and its sides then declared: traced on a 4096 px tile, this model took
    tens of GB."""
    import subprocess
    import sys

    # the peak of this process's own memory (VmHWM): ru_maxrss would carry over the test process's, kept across fork and exec
    script = ("import re, sys; from crackseg.model.export import export_model; from crackseg.model.options import "
              "DeepnessOptions; export_model(sys.argv[1], 'onnx', sys.argv[2], deepness=DeepnessOptions(tile=4096)); "
              "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))")
    result = subprocess.run([sys.executable, "-c", script, str(model_file), str(tmp_path / "m.onnx")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) < 3 * 1024 * 1024  # KiB: under 3 GiB
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [3, 4096, 4096] and session.get_outputs()[0].shape[1:] == [1, 4096, 4096]
