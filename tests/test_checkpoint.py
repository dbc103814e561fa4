from __future__ import annotations

import pytest
import torch
from torch import nn

from crackseg.checkpoint import load_model, read_checkpoint, save_model, unwrap
from crackseg.errors import InputError
from crackseg.models import build_model


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
