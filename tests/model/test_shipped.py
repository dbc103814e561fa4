"""Models that ship with crackseg: predict without --checkpoint, --checkpoint NAME everywhere, crackseg models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import crackseg
from conftest import cli_result
from crackseg.model import shipped
from crackseg.model.checkpoint import PRETRAINED_WEIGHTS, load_model, save_model
from crackseg.model.export import export_model

SIZE_LIMIT = 15_000_000  # bytes: what a model in the repository may weigh


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """A tiny model shipped as 'general' the way the real one is: a float16 safetensors folder."""
    torch.manual_seed(0)
    model = crackseg.build_model("mobilenet_v2")
    model.threshold = 0.31
    save_model(model, tmp_path / "model.pt")
    export_model(tmp_path / "model.pt", "safetensors", tmp_path / "weights" / "general", half=True)
    monkeypatch.setattr(shipped, "WEIGHTS", tmp_path / "weights")
    return tmp_path


def _masks(folder):
    return {path.name: np.asarray(Image.open(path)).tobytes() for path in sorted((folder / "masks").iterdir())}


def test_predict_without_a_checkpoint_runs_the_shipped_model_and_says_so(weights, synth_root):
    code, err = cli_result(["predict", synth_root / "images", "--out", weights / "default", "--no-measure"])
    assert code == 0 and "no --checkpoint: predicting with the shipped general model" in err
    code, err = cli_result(["predict", "--checkpoint", "general", synth_root / "images", "--out", weights / "named", "--no-measure"])
    assert code == 0 and "shipped" not in err
    assert _masks(weights / "default") == _masks(weights / "named") and len(_masks(weights / "named")) == 12


def test_the_shipped_folder_is_float16_and_predicts_as_its_float32_source(weights):
    from safetensors import safe_open

    with safe_open(weights / "weights" / "general" / PRETRAINED_WEIGHTS, "pt") as stored:
        assert {stored.get_slice(name).get_dtype() for name in stored.keys() if name.endswith(".weight")} == {"F16"}
    source, half = load_model(weights / "model.pt"), load_model("general")
    assert half.config() == source.config()  # settings exact: the threshold, the input scaling
    images = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8)
    with torch.no_grad():
        assert (torch.sigmoid(half(images)) - torch.sigmoid(source(images))).abs().max() < 0.02


def test_a_name_works_wherever_a_model_file_does_and_a_real_file_of_that_name_wins(weights, synth_root, monkeypatch):
    assert cli_result(["export", "general", "--format", "onnx", "--out", weights / "g.onnx"])[0] == 0
    code, _ = cli_result(["evaluate", "--checkpoint", "general", "--data", synth_root, "--split", "all", "--device", "cpu",
                          "--out", weights / "report"])
    assert code == 0 and (weights / "report" / "report.json").exists()
    monkeypatch.chdir(weights)
    torch.manual_seed(1)
    save_model(crackseg.build_model("mobilenet_v2"), weights / "general")  # a user's own file named general
    assert load_model(shipped.model_file("general")).threshold == 0.5  # the file, not the shipped 0.31


def test_crackseg_models_lists_what_is_installed(weights, capsys):
    from crackseg.cli.main import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "general (default): unet with the mobilenet_v2 encoder, threshold 0.31" in out and "research use only" in out
    assert "crackseg convert --from crackpot" in out


def test_a_missing_shipped_model_is_one_line(tmp_path, monkeypatch, synth_root):
    monkeypatch.setattr(shipped, "WEIGHTS", tmp_path / "nothing")
    code, err = cli_result(["predict", synth_root / "images", "--out", tmp_path / "out"])
    assert code == 2 and "the shipped general model is missing from this install" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not (shipped.WEIGHTS / "general" / "config.json").exists(), reason="the general model is not in this checkout")
def test_the_real_general_model_is_small_half_precision_and_loads():
    folder = shipped.WEIGHTS / "general"
    assert sum(path.stat().st_size for path in folder.iterdir()) <= SIZE_LIMIT
    model = load_model("general")
    assert (model.arch, model.encoder) == ("unet", "efficientnet-lite0")


def test_a_mistyped_model_name_is_one_line_naming_the_shipped_ones(weights, synth_root):
    for argv in (["predict", "--checkpoint", "genral", synth_root / "images", "--out", weights / "out"],
                 ["export", "genral", "--format", "onnx", "--out", weights / "g.onnx"]):
        code, err = cli_result(argv)
        assert code == 2 and "genral: no such model file or folder, and no shipped model of that name (general;" in err
        assert err.count("\n") == 1 and not (weights / "out").exists() and not (weights / "g.onnx").exists()


def test_predict_without_a_checkpoint_on_no_photos_says_only_that(weights, tmp_path):
    (tmp_path / "none").mkdir()
    code, err = cli_result(["predict", tmp_path / "none", "--out", tmp_path / "out"])
    assert code == 2 and "no images" in err and "shipped" not in err and err.count("\n") == 1


def test_the_real_shipped_model_predicts_with_the_network_shut(synth_root, tmp_path, monkeypatch):
    """A fresh install with no network: nothing on the path from no --checkpoint to masks may connect anywhere."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    (tmp_path / "photos").mkdir()
    for path in sorted((synth_root / "images").iterdir())[:2]:
        (tmp_path / "photos" / path.name).write_bytes(path.read_bytes())
    code, err = cli_result(["predict", tmp_path / "photos", "--out", tmp_path / "out"])
    assert code == 0 and "predicting with the shipped general model" in err, err
    assert len(list((tmp_path / "out" / "masks").iterdir())) == 2
