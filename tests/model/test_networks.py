from __future__ import annotations

import re

import copy
import functools

import pytest
import torch
import torchvision

import crackseg
from crackseg.core.errors import InputError
from crackseg.model.architectures import INPUT_SCALINGS
from crackseg.model.checkpoint import load_encoder_weights, load_model, save_model
from crackseg.model.classic import convert_classic
from crackseg.model.networks import build_model


@functools.cache
def _model(arch: str, encoder: str | None = None):
    torch.manual_seed(0)
    return build_model(encoder, None, arch)


BUILDERS = [("unet", "resnet34"), ("unet", "vgg16"), ("unet", "resnet101"), ("unet16", None), ("unet_resnet34", None), ("unet_resnet101", None)]


@pytest.mark.parametrize("arch, encoder", BUILDERS)
def test_forward_backward_any_size(arch, encoder):
    model = _model(arch, encoder).train()
    for height, width in [(64, 64), (67, 93)]:
        images = torch.rand(2, 3, height, width, requires_grad=False)
        logits = model(images)
        assert logits.shape == (2, 1, height, width)
        model.zero_grad()
        logits.mean().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("arch, encoder", [*BUILDERS, ("resunet", None)])
def test_scaling_the_logits_scales_every_architectures_output(arch, encoder):
    model = copy.deepcopy(_model(arch, encoder)).eval()
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model(images)
        model.scale_logits(0.25)
        assert torch.allclose(model(images), before * 0.25, atol=1e-5 * before.abs().max().item())


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.9])
def test_the_threshold_follows_scaled_logits_so_every_pixel_keeps_its_side(threshold):
    model = copy.deepcopy(_model("resunet", None)).eval()
    model.scale_logits(200.0)  # logits spread over the threshold's logit, as a saturated model's are
    model.threshold = threshold
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        before = torch.sigmoid(model(images)) >= threshold
        assert 0.05 < before.float().mean() < 0.95
        model.scale_logits(0.05)
        after = torch.sigmoid(model(images)) >= model.threshold
    assert (model.threshold == 0.5) == (threshold == 0.5)
    assert (before != after).float().mean() < 1e-3  # at most pixels within float error of the threshold


def test_uint8_and_float_inputs_agree():
    model = _model("unet", "resnet34").eval()
    images = torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.allclose(model(images), model(images.float() / 255), atol=1e-5)


def test_dropout_acts_in_training_only():
    model = _model("unet_resnet34")
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        model.eval()
        assert torch.equal(model(images), model(images))
        model.train()
        assert not torch.equal(model(images), model(images))
    model.eval()


def test_channels_last_gives_the_same_logits():
    model = _model("unet", "resnet34").eval()
    images = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        expected = model(images)
        fast = model.to(memory_format=torch.channels_last)(images.contiguous(memory_format=torch.channels_last))
    model.to(memory_format=torch.contiguous_format)
    assert torch.allclose(expected, fast, atol=1e-4)


def _unet16_keys() -> list[str]:
    """Spelled out from the classic project's layout, independently of crackseg.model.networks."""
    vgg = [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
    blocks = {"conv1": [0, 2], "conv2": [0, 2], "conv3": [0, 2, 4], "conv4": [0, 2, 4], "conv5": [0, 2, 4]}
    keys = [f"encoder.{i}.{p}" for i in vgg for p in ("weight", "bias")]
    keys += [f"{name}.{i}.{p}" for name, idx in blocks.items() for i in idx for p in ("weight", "bias")]
    keys += [f"{d}.block.{i}.conv.{p}" for d in ("center", "dec5", "dec4", "dec3", "dec2") for i in (1, 2) for p in ("weight", "bias")]
    keys += ["dec1.conv.weight", "dec1.conv.bias", "final.weight", "final.bias"]
    return keys


def test_classic_unet16_keys_and_channels():
    state = _model("unet16").net.state_dict()
    assert sorted(state) == sorted(_unet16_keys()) and len(state) == 76
    channels = {name: (state[f"{name}.block.1.conv.weight"].shape[1], state[f"{name}.block.1.conv.weight"].shape[0], state[f"{name}.block.2.conv.weight"].shape[0])
                for name in ("center", "dec5", "dec4", "dec3", "dec2")}
    assert channels == {"center": (512, 512, 256), "dec5": (768, 512, 256), "dec4": (768, 512, 256), "dec3": (512, 256, 64), "dec2": (192, 128, 32)}
    assert state["dec1.conv.weight"].shape[:2] == (32, 96) and state["final.weight"].shape[:2] == (1, 32)


@pytest.mark.parametrize("arch, expected", [
    ("unet_resnet34", {"center": (512, 512, 256), "dec5": (768, 512, 256), "dec4": (512, 512, 256), "dec3": (384, 256, 64), "dec2": (128, 128, 128), "dec1": (128, 128, 32)}),
    ("unet_resnet101", {"center": (2048, 512, 256), "dec5": (2304, 512, 256), "dec4": (1280, 512, 256), "dec3": (768, 256, 64), "dec2": (320, 128, 128), "dec1": (128, 128, 32)}),
])
def test_classic_unet_resnet_keys_and_channels(arch, expected):
    state = _model(arch).net.state_dict()
    channels = {name: (state[f"{name}.block.1.conv.weight"].shape[1], state[f"{name}.block.1.conv.weight"].shape[0], state[f"{name}.block.2.conv.weight"].shape[0])
                for name in expected}
    assert channels == expected
    for key in ("encoder.fc.weight", "conv1.0.weight", "conv1.1.running_mean", "conv2.0.bn1.running_mean", "conv5.0.conv1.weight", "dec0.conv.weight", "final.bias"):
        assert key in state
    assert not any(key.startswith(("module.", "net.")) for key in state)
    assert _model(arch).size_divisor == 64


def _classic_file(tmp_path, arch):
    net = _model(arch).net
    path = tmp_path / "model_best.pt"
    torch.save({"model": net.state_dict(), "epoch": 7, "valid_loss": 0.123, "train_loss": torch.tensor(0.2)}, path)
    return path


def _classic_forward(net, images):
    """The classic inference path: ImageNet normalization, then the bare network."""
    mean, std = (torch.tensor(values).view(1, 3, 1, 1) for values in INPUT_SCALINGS["imagenet"])
    return net((images - mean) / std)


@pytest.mark.parametrize("arch", ["unet16", "unet_resnet34"])
def test_convert_classic_round_trip(tmp_path, arch):
    source = _classic_file(tmp_path, arch)
    convert_classic(source, arch, tmp_path / "model.pt")
    model = crackseg.load_model(tmp_path / "model.pt")
    assert not model.training and model.arch == arch and model.threshold == pytest.approx(0.2)
    images = torch.rand(2, 3, 64, 128)
    classic = _model(arch).net.eval()
    with torch.no_grad():
        assert torch.allclose(model(images), _classic_forward(classic, images), atol=1e-5)
    payload = torch.load(tmp_path / "model.pt", weights_only=True)
    assert payload["converted_from"]["epoch"] == 7 and payload["converted_from"]["train_loss"] == pytest.approx(0.2)


def test_convert_refuses_the_wrong_architecture_and_overwrites(tmp_path):
    source = _classic_file(tmp_path, "unet16")
    with pytest.raises(InputError, match="holds a unet16 model, not the unet_resnet34"):
        convert_classic(source, "unet_resnet34", tmp_path / "model.pt")
    convert_classic(source, "unet16", tmp_path / "model.pt")
    with pytest.raises(InputError, match="already exists"):
        convert_classic(source, "unet16", tmp_path / "model.pt")
    with pytest.raises(InputError, match="holds a unet16 model .* not the unet that was asked for"):
        load_model(tmp_path / "model.pt", arch="unet")


def test_convert_cli(tmp_path):
    from crackseg.cli.main import main

    source = _classic_file(tmp_path, "unet16")
    assert main(["convert", str(source), "--arch", "unet16", "--out", str(tmp_path / "m.pt")]) == 0
    assert load_model(tmp_path / "m.pt").arch == "unet16"


def test_convert_refuses_crackseg_files_and_incomplete_classic_files(tmp_path):
    source = _classic_file(tmp_path, "unet16")
    convert_classic(source, "unet16", tmp_path / "model.pt")
    with pytest.raises(InputError, match="already a crackseg model file"):
        convert_classic(tmp_path / "model.pt", "unet16", tmp_path / "again.pt")
    classic = torch.load(source, weights_only=True)
    dropped = sorted(classic["model"])[0]
    del classic["model"][dropped]
    torch.save(classic, tmp_path / "incomplete.pt")
    with pytest.raises(InputError, match=rf"do not match unet16 .* missing e.g. {re.escape(dropped)}"):
        convert_classic(tmp_path / "incomplete.pt", "unet16", tmp_path / "x.pt")
    torch.save({"model": {"final.weight": "not a tensor"}, "epoch": 1}, tmp_path / "odd.pt")
    with pytest.raises(InputError, match="no 'model' state dict of tensors"):
        convert_classic(tmp_path / "odd.pt", "unet16", tmp_path / "x.pt")
    with pytest.raises(InputError, match="is a folder"):
        convert_classic(source, "unet16", tmp_path)


def test_offline_imagenet_fails_with_a_way_forward(monkeypatch):
    import segmentation_models_pytorch.encoders as smp_encoders

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(smp_encoders, "hf_hub_download", offline)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    for arch, encoder in [("unet", "resnet18"), ("unet16", None)]:
        with pytest.raises(InputError) as caught:
            build_model(encoder, "imagenet", arch)
        message = str(caught.value)
        assert "cannot download imagenet weights" in message and "--encoder-weights PATH" in message and "none" in message
        assert "\n" not in message


@pytest.mark.parametrize("arch, encoder, tv_builder", [
    ("unet", "resnet18", torchvision.models.resnet18),
    ("unet16", None, torchvision.models.vgg16),
])
def test_local_encoder_weights_are_loaded_exactly(tmp_path, arch, encoder, tv_builder):
    torch.manual_seed(42)
    source = tv_builder().state_dict()
    torch.save(source, tmp_path / "encoder.pt")
    model = build_model(encoder, None, arch)
    load_encoder_weights(model, tmp_path / "encoder.pt")
    loaded = model.net.encoder.state_dict()
    for key, value in loaded.items():
        original = source[key] if arch == "unet" else source[f"features.{key}"]
        assert torch.equal(value, original), key


def test_encoder_weights_of_another_encoder_are_refused(tmp_path):
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pt")
    with pytest.raises(InputError, match="not a state dict of the resnet34 encoder: .*wrong shape|missing"):
        load_encoder_weights(build_model("resnet34"), tmp_path / "r18.pt")
    (tmp_path / "junk.pt").write_text("junk")
    with pytest.raises(InputError, match="junk.pt: not a readable encoder weights file"):
        load_encoder_weights(build_model("resnet18"), tmp_path / "junk.pt")


def test_build_model_reads_no_files():
    with pytest.raises(InputError, match="crackseg.load_encoder_weights"):
        build_model("resnet18", "encoder.pt")
    assert crackseg.load_encoder_weights is load_encoder_weights  # the README's way to load a local encoder file


def test_unknown_names_are_user_errors():
    with pytest.raises(InputError, match="unknown architecture"):
        build_model(arch="segformer")
    with pytest.raises(InputError, match="unknown encoder"):
        build_model("resnet9000")
    with pytest.raises(InputError, match="always uses the vgg16 encoder"):
        build_model("resnet34", arch="unet16")


def test_activation_checkpointing_refuses_an_encoder_without_stages_it_can_find():
    from crackseg.model.networks import enable_activation_checkpointing

    with pytest.raises(InputError, match=r"^--activation-checkpointing finds no stages to recompute in the efficientnet-b0 encoder; leave it out"):
        enable_activation_checkpointing(build_model("efficientnet-b0"))


@pytest.mark.parametrize("encoder, stages", [("resnet18", 4), ("efficientnet-lite0", 7)])
def test_activation_checkpointing_keeps_gradients_names_and_batchnorm_statistics(encoder, stages):
    import copy

    from crackseg.model.networks import enable_activation_checkpointing, encoder_stages

    torch.manual_seed(0)
    plain = build_model(encoder).train()
    checkpointed = copy.deepcopy(plain)
    enable_activation_checkpointing(checkpointed)
    images = torch.rand(2, 3, 64, 64)
    runs = []
    encoder_stages(checkpointed.net.encoder)[0][0].register_forward_pre_hook(lambda *args: runs.append(1))
    for model in (plain, checkpointed):
        model(images).square().mean().backward()
    assert len(runs) == 2  # the forward pass, then the recomputation in the backward pass
    assert list(plain.state_dict()) == list(checkpointed.state_dict())
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        assert torch.equal(a.grad, b.grad), name
    for (name, a), (_, b) in zip(plain.state_dict().items(), checkpointed.state_dict().items()):
        assert torch.equal(a, b), name  # the recomputation must not update running statistics a second time
    checkpointed_stages = encoder_stages(checkpointed.net.encoder)
    assert len(checkpointed_stages) == stages and all(type(s).__name__.startswith("Checkpointed") for s in checkpointed_stages)
    stage = checkpointed_stages[0]
    assert "forward" not in vars(stage) and "forward" not in vars(stage._replicate_for_data_parallel())  # DataParallel replicas run their own weights


@pytest.mark.parametrize("encoder, scaling, mean, std", [
    ("resnet18", "imagenet", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ("resnet18", "auto", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ("resnet18", "tf", (127 / 255,) * 3, (128 / 255,) * 3),
    ("efficientnet-lite0", "auto", (127 / 255,) * 3, (128 / 255,) * 3),
])
def test_the_input_scaling_is_the_models_and_kept_in_its_file(tmp_path, encoder, scaling, mean, std):
    model = build_model(encoder, None, scaling=scaling).eval()
    assert model.config()["mean"] == pytest.approx(mean) and model.config()["std"] == pytest.approx(std)
    image = torch.full((1, 3, 64, 64), 127, dtype=torch.uint8)
    if scaling == "tf":  # (127 - 127) / 128: mid-grey is 0 for the encoder
        seen = []
        model.net.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        model(image)
        assert seen[0].abs().max() < 1e-6
    save_model(model, tmp_path / "m.pt")
    assert load_model(tmp_path / "m.pt").config()["mean"] == pytest.approx(mean)
