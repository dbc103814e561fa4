"""crackseg convert --from crackpot: crackpot's Keras ResUNet read without Keras, checked against Keras itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from importlib.util import find_spec

import numpy as np
import pytest
import torch
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.model.checkpoint import load_model, read_checkpoint
from crackseg.model.crackpot import convert_crackpot
from crackseg.model.shipped import crackpot_model_file
from crackseg.training.options import TrainConfig
from crackseg.training.train import fit
from conftest import cli_result, isolated

needs_crackpot = pytest.mark.skipif(find_spec("crackpot") is None, reason="crackpot is not installed (crackseg[crackpot])")

_KERAS_REFERENCE = """
import sys, numpy as np, keras
model = keras.models.load_model(sys.argv[1], compile=False)
images = np.load(sys.argv[2])
np.save(sys.argv[3], np.asarray(model.predict(images.astype(np.float32) / 255, verbose=0))[..., 0])
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("crackpot")
    convert_crackpot(None, folder / "crackpot.pt")
    return folder / "crackpot.pt"


@needs_crackpot
@pytest.mark.skipif(find_spec("keras") is None, reason="Keras is not installed")
def test_the_converted_model_equals_keras_on_the_same_pixels(tmp_path, converted, cfd_root):
    """Keras 3 (on its torch backend) runs crackpot's own file; crackseg's model must agree within 1e-4."""
    photos = sorted((cfd_root / "images").iterdir())[:2]
    images = np.stack([np.asarray(Image.open(p).convert("RGB").resize((256, 256))) for p in photos])
    images = np.concatenate([images, np.random.default_rng(0).integers(0, 256, (1, 256, 256, 3), dtype=np.uint8)])
    np.save(tmp_path / "images.npy", images)
    subprocess.run([sys.executable, "-c", _KERAS_REFERENCE, str(crackpot_model_file()), str(tmp_path / "images.npy"),
                    str(tmp_path / "keras.npy")], check=True, env={**os.environ, "KERAS_BACKEND": "torch"})
    expected = np.load(tmp_path / "keras.npy")
    model = load_model(converted)
    with torch.no_grad():
        ours = torch.sigmoid(model(torch.from_numpy(images).permute(0, 3, 1, 2)))[:, 0].numpy()
    assert np.abs(ours - expected).max() < 1e-4
    assert (expected > 0.5).any()  # cracks found on the photos: a comparison of real predictions, not of zeros


@needs_crackpot
def test_the_converted_model_records_its_source_and_runs_on_any_size(converted):
    payload = torch.load(converted, weights_only=True)
    assert payload["converted_from"]["from"] == "crackpot" and payload["converted_from"]["licence"] == "MIT"
    model = load_model(converted)
    assert (model.arch, model.threshold, model.size_divisor) == ("resunet", 0.5, 16)
    assert model.mean.abs().max() == 0 and (model.std == 1).all()  # crackpot divides by 255, nothing else
    with torch.no_grad():
        assert model(torch.randint(0, 256, (1, 3, 75, 130), dtype=torch.uint8)).shape == (1, 1, 75, 130)


@needs_crackpot
def test_cli_converts_and_predicts_with_it(tmp_path, converted, synth_root):
    assert cli_result(["convert", "--from", "crackpot", "--out", tmp_path / "c.pt"]) == (0, "")
    assert cli_result(["convert", "--from", "crackpot", "--out", tmp_path / "c.pt"])[0] == 2  # no --overwrite
    code, _ = cli_result(["predict", "--checkpoint", converted, "--resize", "64", "--device", "cpu", "--no-measure",
                          synth_root / "images", "--out", tmp_path / "preds"])
    assert code == 0 and len(list((tmp_path / "preds").rglob("*.png"))) == len(list((synth_root / "images").iterdir()))


@needs_crackpot
@isolated
def test_evaluate_and_export_take_it_like_any_other_model(tmp_path, converted, synth_root):
    pytest.importorskip("onnxruntime")
    code, err = cli_result(["evaluate", "--checkpoint", converted, "--data", synth_root, "--split", "all", "--device", "cpu",
                            "--out", tmp_path / "report"])
    assert code == 0, err
    assert 0 <= json.loads((tmp_path / "report" / "report.json").read_text())["dataset"]["f1"] <= 1
    assert cli_result(["export", converted, "--format", "onnx", "--out", tmp_path / "c.onnx"])[0] == 0
    for name, model in (("torch", converted), ("onnx", tmp_path / "c.onnx")):
        code, err = cli_result(["predict", "--checkpoint", model, "--device", "cpu", "--no-measure", "--save-prob", "16",
                                synth_root / "images", "--out", tmp_path / name])
        assert code == 0, err
    for path in sorted((tmp_path / "torch" / "probs").iterdir()):
        expected = np.asarray(Image.open(path), dtype=np.float64) / 65535
        got = np.asarray(Image.open(tmp_path / "onnx" / "probs" / path.name), dtype=np.float64) / 65535
        assert np.abs(got - expected).max() < 1e-3, path.name


@needs_crackpot
def test_fine_tuning_it_first_brings_its_saturated_logits_into_range(converted, synth_root, tmp_path):
    """Its logits run to hundreds; trained as they are, the first epochs' loss is about 30 and nothing is learnt."""
    config = TrainConfig(run=str(tmp_path / "tuned"), data=str(synth_root), arch="resunet", init=str(converted),
                         input_scaling="auto", crop_size=64, batch_size=4, workers=0, epochs=2, device="cpu", amp="off")
    fit(config)
    saved = read_checkpoint(tmp_path / "tuned" / "last.pt")
    scale = saved["config"]["resolved"]["init_logit_scale"]
    assert 0 < scale < 0.1
    log = (tmp_path / "tuned" / "train.log").read_text()
    assert f"--init logits saturated: scaled by {scale:.3g}" in log
    losses = [float(loss) for loss in re.findall(r"train loss ([0-9.]+)", log)]
    assert len(losses) == 2 and max(losses) < 2
    image = torch.from_numpy(np.array(Image.open(sorted((synth_root / "images").iterdir())[0]).convert("RGB")))
    with torch.no_grad():
        tuned = load_model(tmp_path / "tuned" / "last.pt")(image.permute(2, 0, 1)[None])
    assert tuned.abs().max() < 100  # trained from the scaled start, not drifted back into saturation


def _keras_file(path, layers: list[dict]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", json.dumps({"class_name": "Functional", "config": {"layers": layers}}))
        archive.writestr("model.weights.h5", b"")


@pytest.mark.parametrize("make, message", [
    (lambda path: path.write_text("not a zip"), "not a Keras 3 model file"),
    (lambda path: _keras_file(path, [{"class_name": "Conv2D", "name": "conv2d", "config": {}}]),
     "model.weights.h5 is not readable Keras weights"),
])
def test_what_is_not_crackpots_model_is_a_one_line_error(tmp_path, make, message):
    pytest.importorskip("h5py")
    make(tmp_path / "model.keras")
    code, err = cli_result(["convert", "--from", "crackpot", tmp_path / "model.keras", "--out", tmp_path / "m.pt"])
    assert code == 2 and message in err and "Traceback" not in err and not (tmp_path / "m.pt").exists()


def test_another_keras_graph_is_refused_by_its_layers(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "w.h5", "w") as h5:
        h5.create_dataset("layers/conv2d/vars/0", data=np.zeros((3, 3, 3, 8), np.float32))
        h5.create_dataset("layers/conv2d/vars/1", data=np.zeros(8, np.float32))
    with zipfile.ZipFile(tmp_path / "other.keras", "w") as archive:
        archive.writestr("config.json", json.dumps({"config": {"layers": [{"class_name": "Conv2D", "name": "conv2d", "config": {}}]}}))
        archive.write(tmp_path / "w.h5", "model.weights.h5")
    with pytest.raises(InputError, match="1 convolutions and 0 batch norms, not the 30 and 28 of crackpot's ResUNet"):
        convert_crackpot(tmp_path / "other.keras", tmp_path / "m.pt")


def test_classic_and_crackpot_flags_are_checked_together(tmp_path):
    assert "needs its path and --arch" in cli_result(["convert", "--out", tmp_path / "m.pt"])[1]
    code, err = cli_result(["convert", "--from", "crackpot", "--arch", "unet16", "--out", tmp_path / "m.pt"])
    assert code == 2 and "--arch is for classic checkpoints" in err


@pytest.mark.parametrize("name", ["m.onnx", "m.safetensors", "m.xml", "m.keras"])
def test_a_converted_model_named_as_another_format_is_refused_before_any_work(tmp_path, name):
    code, err = cli_result(["convert", "--from", "crackpot", "--out", tmp_path / name])
    assert code == 2 and err.count("\n") == 1 and "a crackseg model file is a .pt file" in err and not (tmp_path / name).exists()


def test_a_keras_file_given_as_a_checkpoint_says_what_it_is(tmp_path):
    _keras_file(tmp_path / "model.keras", [])
    with zipfile.ZipFile(tmp_path / "model.keras", "a") as archive:
        archive.writestr("metadata.json", "{}")
    Image.new("RGB", (64, 64)).save(tmp_path / "photo.png")
    for args in (["convert", tmp_path / "model.keras", "--arch", "unet16", "--out", tmp_path / "m.pt"],
                 ["predict", "--checkpoint", tmp_path / "model.keras", tmp_path / "photo.png", "--out", tmp_path / "out"]):
        code, err = cli_result(args)
        assert code == 2 and err.count("\n") == 1 and "a Keras model, not a PyTorch file; crackseg convert --from crackpot" in err, err


@needs_crackpot
@pytest.mark.parametrize("edit, message", [
    (lambda layers: next(l for l in layers if l["class_name"] == "BatchNormalization")["config"].update(epsilon=0.5), "epsilon 0.5"),
    (lambda layers: next(l for l in layers if l["class_name"] == "UpSampling2D")["config"].update(interpolation="bilinear"),
     "interpolation 'bilinear'"),
    (lambda layers: layers.insert(1, {"class_name": "Rescaling", "name": "rescaling", "config": {"scale": 2.0}}), "1 Rescaling"),
    (lambda layers: next(l for l in layers if l["class_name"] == "Activation")["config"].update(activation="elu"), "activation 'elu'"),
])
def test_crackpots_weights_in_a_graph_that_computes_otherwise_are_refused(tmp_path, edit, message):
    """The same weights under another epsilon, interpolation, extra layer or activation predict otherwise than Keras."""
    with zipfile.ZipFile(crackpot_model_file()) as original, zipfile.ZipFile(tmp_path / "edited.keras", "w") as edited:
        config = json.loads(original.read("config.json"))
        edit(config["config"]["layers"])
        for item in original.infolist():
            edited.writestr(item, json.dumps(config) if item.filename == "config.json" else original.read(item))
    code, err = cli_result(["convert", "--from", "crackpot", tmp_path / "edited.keras", "--out", tmp_path / "m.pt"])
    assert code == 2 and err.count("\n") == 1 and message in err and not (tmp_path / "m.pt").exists(), err
