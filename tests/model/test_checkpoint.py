from __future__ import annotations

import pytest
import torch
from conftest import as_format_1
from torch import nn

from crackseg.model.checkpoint import load_model, read_checkpoint, save_model, unwrap
from crackseg.core.errors import InputError
from crackseg.model.networks import build_model


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    return build_model("resnet18").eval()


def _file(payload_model, path, **extra):
    save_model(payload_model, path, **extra)
    return path


def test_saved_model_loads_with_the_same_outputs_and_threshold(tmp_path, small_model):
    small_model.threshold = 0.37
    path = _file(small_model, tmp_path / "best.pt")
    loaded = load_model(path)
    assert loaded.threshold == pytest.approx(0.37) and not loaded.training
    images = torch.rand(1, 3, 40, 50)
    with torch.no_grad():
        assert torch.equal(loaded(images), small_model(images))


def test_wrapper_prefixes_are_never_saved(tmp_path, small_model):
    wrapped = nn.DataParallel(small_model)
    assert unwrap(wrapped) is small_model
    assert any(key.startswith("module.") for key in wrapped.state_dict())
    state = read_checkpoint(_file(wrapped, tmp_path / "wrapped.pt"))["model"]["state_dict"]
    assert state.keys() == small_model.state_dict().keys()
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in state)


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path, small_model, monkeypatch):
    path = _file(small_model, tmp_path / "last.pt", epoch=1)

    def torn_save(payload, file):
        file.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        save_model(small_model, path, epoch=2)
    monkeypatch.undo()
    assert read_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.parametrize("content, message", [
    (b"", "not a readable checkpoint file"),
    (b"PK\x03\x04 torn zip", "not a readable checkpoint file"),
])
def test_torn_files_are_one_line_errors(tmp_path, content, message):
    (tmp_path / "bad.pt").write_bytes(content)
    with pytest.raises(InputError, match=message) as caught:
        read_checkpoint(tmp_path / "bad.pt")
    assert str(tmp_path / "bad.pt") in str(caught.value) and "\n" not in str(caught.value)


def test_foreign_and_classic_files_are_named(tmp_path):
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.pt")
    with pytest.raises(InputError, match="not a crackseg checkpoint"):
        read_checkpoint(tmp_path / "foreign.pt")
    torch.save({"model": {"final.weight": torch.zeros(1)}, "epoch": 3}, tmp_path / "classic.pt")
    with pytest.raises(InputError, match="classic crack-segmentation checkpoint; convert it first"):
        read_checkpoint(tmp_path / "classic.pt")
    with pytest.raises(InputError, match="no such checkpoint file"):
        read_checkpoint(tmp_path / "missing.pt")


def test_newer_format_is_refused(tmp_path):
    torch.save({"format": "crackseg", "version": 99}, tmp_path / "new.pt")
    with pytest.raises(InputError, match="newer crackseg"):
        read_checkpoint(tmp_path / "new.pt")


def test_a_flipped_byte_in_the_weights_is_caught_on_load(tmp_path, small_model):
    import zipfile

    path = _file(small_model, tmp_path / "model.pt")
    with zipfile.ZipFile(path) as archive:
        largest = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda info: info.file_size)
        start = largest.header_offset + 30 + len(largest.filename.encode()) + len(largest.extra)
    data = bytearray(path.read_bytes())
    data[start + largest.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)  # torch itself does not notice
    with pytest.raises(InputError, match="do not match the checksum saved with them"):
        load_model(path)


def _cli_error(args) -> str:
    """The one line that ``crackseg ARGS`` prints for a user's mistake (exit status 2)."""
    import contextlib
    import io

    from crackseg.cli.main import main

    with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(io.StringIO()) as stderr:
        main(list(map(str, args)))
    err = stderr.getvalue()
    assert exit.value.code == 2 and err.startswith("crackseg: error: ") and err.count("\n") == 1, err
    return err


def _edited(path, out, edit):
    """A copy of the crackseg file ``path`` whose payload ``edit`` changed, written as torch writes any file."""
    payload = torch.load(path, weights_only=True)
    edit(payload)
    torch.save(payload, out)
    return out


@pytest.mark.parametrize("setting, value", [
    ("threshold", 0.9), ("mean", [0.5, 0.5, 0.5]), ("std", [0.25, 0.25, 0.25]), ("size_divisor", 64), ("encoder", "resnet34"),
])
def test_every_stored_setting_is_under_the_checksum(tmp_path, small_model, setting, value):
    small_model.threshold = 0.37
    path = _file(small_model, tmp_path / "model.pt")
    edited = _edited(path, tmp_path / "edited.pt", lambda payload: payload["model"]["config"].update({setting: value}))
    with pytest.raises(InputError, match="do not match the checksum saved with them") as caught:
        load_model(edited)
    assert str(edited) in str(caught.value) and "\n" not in str(caught.value)
    assert load_model(path).threshold == pytest.approx(0.37)  # the file as saved loads


def test_a_safetensors_folder_has_its_settings_under_the_checksum_too(tmp_path, small_model):
    import json

    from crackseg.model.checkpoint import save_pretrained

    small_model.threshold = 0.37
    save_pretrained(small_model, tmp_path / "st")
    config_file = tmp_path / "st" / "config.json"
    config = json.loads(config_file.read_text())
    config["model"]["threshold"] = 0.05
    config_file.write_text(json.dumps(config))
    with pytest.raises(InputError, match="do not match the checksum saved with them"):
        load_model(tmp_path / "st")
    del config["sha256"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(InputError, match="has no checksum"):
        load_model(tmp_path / "st")


@pytest.mark.parametrize("removed", ["model.safetensors", "config.json"])
def test_a_safetensors_folder_missing_a_file_names_it(tmp_path, small_model, removed):
    from crackseg.model.checkpoint import save_pretrained

    save_pretrained(small_model, tmp_path / "st")
    (tmp_path / "st" / removed).unlink()
    err = _cli_error(["export", tmp_path / "st", "--format", "onnx", "--out", tmp_path / "m.onnx"])
    assert f"{tmp_path / 'st'}: not a crackseg model folder (no {removed})" in err


@pytest.mark.parametrize("setting, value, message", [
    ("threshold", float("nan"), "threshold nan is not a number in"),
    ("threshold", 7.0, r"threshold 7.0 is not a number in \[0, 1\]"),
    ("threshold", -0.1, "threshold -0.1 is not a number in"),
    ("threshold", "0.5", "threshold '0.5' is not a number in"),
    ("mean", [0.5, 0.5], r"mean \[0.5, 0.5\] is not 3 finite numbers"),
    ("mean", [0.5, float("inf"), 0.5], "mean .* is not 3 finite numbers"),
    ("std", [0.2, 0.0, 0.2], r"std \[0.2, 0.0, 0.2\] is not 3 numbers above 0"),
    ("size_divisor", 0, "size_divisor 0 is not a positive whole number"),
    ("size_divisor", 32.5, "size_divisor 32.5 is not a positive whole number"),
    ("arch", "unet9", "arch 'unet9' is not one of unet, unet16"),
    ("arch", ["unet"], r"arch \['unet'\] is not one of unet, unet16"),
    ("encoder", "no-such-encoder", "encoder 'no-such-encoder' is not a segmentation_models_pytorch encoder"),
])
def test_impossible_settings_are_one_line_errors_naming_the_setting(tmp_path, small_model, setting, value, message):
    path = _file(small_model, tmp_path / "model.pt")
    edited = _edited(path, tmp_path / "edited.pt", lambda payload: payload["model"]["config"].update({setting: value}))
    with pytest.raises(InputError, match=message) as caught:
        load_model(edited)
    assert str(caught.value).startswith(f"{edited}: its stored ") and "\n" not in str(caught.value)
    (tmp_path / "in").mkdir()
    from PIL import Image
    import numpy as np

    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "in" / "a.png")
    assert "edited.pt: its stored" in _cli_error(["predict", tmp_path / "in", "--model", edited, "--out", tmp_path / "out", "--device", "cpu"])


def test_a_missing_setting_is_a_one_line_error(tmp_path, small_model):
    path = _file(small_model, tmp_path / "model.pt")
    edited = _edited(path, tmp_path / "edited.pt", lambda payload: payload["model"]["config"].pop("mean"))
    with pytest.raises(InputError, match="edited.pt: its stored model config lacks mean"):
        load_model(edited)


def test_files_without_a_settings_checksum_are_refused_with_the_command_that_re_saves_them(tmp_path, small_model):
    small_model.threshold = 0.37
    path = _file(small_model, tmp_path / "model.pt", epoch=3)
    unchecked = _edited(path, tmp_path / "unchecked.pt", lambda payload: payload["model"].pop("sha256"))
    older = _edited(path, tmp_path / "older.pt", as_format_1)
    for file in (unchecked, older):
        with pytest.raises(InputError, match="re-save it: crackseg export .* --format safetensors --out") as caught:
            read_checkpoint(file)
        assert str(caught.value).startswith(f"{file}: ") and "\n" not in str(caught.value)
    assert "written by an older crackseg" in _cli_error(["export", older, "--format", "onnx", "--out", tmp_path / "m.onnx"])
    # the command the message names re-saves it with a checksum over the settings too
    command = str(caught.value).split("re-save it: ", 1)[1].split()
    from crackseg.cli.main import main

    assert command[:2] == ["crackseg", "export"] and main(command[1:]) == 0
    resaved = load_model(tmp_path / "older-resaved")
    assert resaved.threshold == pytest.approx(0.37)
    images = torch.rand(1, 3, 40, 50)
    with torch.no_grad():
        assert torch.equal(resaved(images), small_model(images))
    # re-saving still checks the older checksum: damaged weights are not given a new one
    def damage(payload):
        as_format_1(payload)
        payload["model"]["state_dict"]["net.segmentation_head.0.bias"] += 1
    damaged = _edited(path, tmp_path / "damaged.pt", damage)
    assert "do not match the checksum" in _cli_error(["export", damaged, "--format", "safetensors", "--out", tmp_path / "x"])
    assert not (tmp_path / "x").exists()


def test_saving_refuses_settings_that_could_not_be_loaded_back(tmp_path, small_model):
    small_model.threshold = float("nan")
    try:
        with pytest.raises(InputError, match="cannot save the model: its threshold nan is not a number in"):
            save_model(small_model, tmp_path / "model.pt")
    finally:
        small_model.threshold = 0.5
    assert not (tmp_path / "model.pt").exists()


def test_an_exported_model_given_as_a_checkpoint_says_what_it_is(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07\x12\x07pytorch")
    (tmp_path / "m.pt").write_bytes(b"\x08\x07\x12\x07pytorch")
    err = _cli_error(["export", tmp_path / "m.onnx", "--format", "openvino", "--out", tmp_path / "m.xml"])
    assert "m.onnx: an exported ONNX model, not a crackseg checkpoint; give the checkpoint (.pt) or safetensors folder" in err
    for path in (tmp_path / "m.onnx", tmp_path / "m.pt"):
        with pytest.raises(InputError) as caught:
            read_checkpoint(path)
        assert "weights_only" not in str(caught.value) and "Re-running" not in str(caught.value)
    assert "not a PyTorch file" in str(caught.value)
