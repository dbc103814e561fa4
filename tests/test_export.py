"""Exported models: ONNX / OpenVINO equal torch, carry their metadata, and predict like checkpoints."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import crackseg
from crackseg.checkpoint import load_model, save_model
from crackseg.cli import main
from crackseg.errors import InputError
from crackseg.export import export_model, load_inference_model
from conftest import isolated

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")


def _torch_probabilities(model, images: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(model(images)).numpy()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A tiny smp model file with a threshold that is not the default."""
    folder = tmp_path_factory.mktemp("small")
    torch.manual_seed(0)
    model = crackseg.build_model("mobilenet_v2")
    model.threshold = 0.37
    save_model(model, folder / "model.pt")
    export_model(folder / "model.pt", "onnx", folder / "m.onnx")
    export_model(folder / "model.pt", "openvino", folder / "m.xml")
    export_model(folder / "model.pt", "safetensors", folder / "st")
    return folder


@pytest.mark.parametrize("arch, encoder", [("unet", "mobilenet_v2"), ("unet", "efficientnet-b0"), ("unet16", None),
                                           ("unet_resnet34", None)])
@isolated
def test_every_architecture_exports_and_equals_torch_at_odd_sizes(tmp_path, arch, encoder):
    torch.manual_seed(1)
    model = crackseg.build_model(encoder, arch=arch).eval()
    save_model(model, tmp_path / "model.pt")
    export_model(tmp_path / "model.pt", "onnx", tmp_path / "model.onnx")
    export_model(tmp_path / "model.pt", "openvino", tmp_path / "model.xml")
    for shape in [(1, 3, 67, 93), (2, 3, 40, 130)]:
        images = torch.randint(0, 256, shape, dtype=torch.uint8)
        expected = _torch_probabilities(model, images)
        for path in (tmp_path / "model.onnx", tmp_path / "model.xml"):
            got = load_inference_model(path)(images).numpy()
            assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-3, (path.suffix, shape)


@isolated
def test_metadata_travels_with_the_exported_files(small):
    import onnx

    onnx.checker.check_model(str(small / "m.onnx"))
    props = {p.key: p.value for p in onnx.load(str(small / "m.onnx")).metadata_props}
    assert props["crackseg_version"] == crackseg.__version__ and props["arch"] == "unet" and props["encoder"] == "mobilenet_v2"
    for path, backend in [(small / "m.onnx", "onnxruntime"), (small / "m.xml", "openvino"), (small / "m.onnx", "openvino")]:
        runtime = load_inference_model(path, backend)
        assert (runtime.backend, runtime.threshold, runtime.size_divisor, runtime.arch) == (backend, 0.37, 32, "unet")
    with pytest.raises(InputError, match="already exists"):
        export_model(small / "model.pt", "onnx", small / "m.onnx")


def test_safetensors_folder_loads_without_unpickling_and_refuses_a_wrong_config(tmp_path, small, monkeypatch):
    import json

    export_model(small / "model.pt", "safetensors", tmp_path / "st")  # what small/st is, written here to be edited
    export_model(_classic_file(tmp_path), "safetensors", tmp_path / "classic_st")  # UNet16 shares tensors between names
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["config.json", "model.safetensors"]
    original = load_model(small / "model.pt")

    def no_pickle(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_pickle)
    loaded = load_model(tmp_path / "st")
    assert loaded.threshold == pytest.approx(0.37)
    images = torch.randint(0, 256, (1, 3, 48, 64), dtype=torch.uint8)
    assert np.array_equal(_torch_probabilities(loaded, images), _torch_probabilities(original, images))
    config = json.loads((tmp_path / "st" / "config.json").read_text())
    config["model"]["encoder"] = "resnet18"
    (tmp_path / "st" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as caught:
        load_model(tmp_path / "st")
    assert "do not fit the unet model with the resnet18 encoder" in str(caught.value) and "\n" not in str(caught.value)
    assert load_model(tmp_path / "classic_st").arch == "unet16"


def _classic_file(tmp_path):
    torch.manual_seed(2)
    save_model(crackseg.build_model(arch="unet16"), tmp_path / "unet16.pt")
    return tmp_path / "unet16.pt"


def _rows(path):
    with open(path) as file:
        return list(csv.DictReader(file))


@isolated
def test_predict_through_every_runtime_writes_what_torch_writes(tmp_path, small):
    rng = np.random.default_rng(0)
    (tmp_path / "in").mkdir()
    for index, (height, width) in enumerate([(70, 90), (64, 64), (300, 260)]):
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(tmp_path / "in" / f"{index}.png")
    runs = {"torch": [small / "model.pt"], "onnx": [small / "m.onnx"], "xml": [small / "m.xml"],
            "onnx-openvino": [small / "m.onnx", "--backend", "openvino"], "safetensors": [small / "st"]}
    for name, model_args in runs.items():
        assert main(["predict", str(tmp_path / "in"), "--model", *map(str, model_args), "--out", str(tmp_path / name),
                     "--save-prob", "16", "--tile", "128", "--overlap", "32", "--tta", "flip", "--device", "cpu"]) == 0
    for name in runs:
        for index in range(3):
            reference = np.asarray(Image.open(tmp_path / "torch" / "probs" / f"{index}.png"), dtype=np.float64) / 65535
            probs = np.asarray(Image.open(tmp_path / name / "probs" / f"{index}.png"), dtype=np.float64) / 65535
            masks = [np.asarray(Image.open(tmp_path / run / "masks" / f"{index}.png")) for run in ("torch", name)]
            assert np.abs(probs - reference).max() < 1e-3 and (masks[0] == masks[1]).mean() >= 0.999, (name, index)
        assert len(_rows(tmp_path / name / "predictions.csv")) == 3


@isolated
def test_real_photos_give_the_same_masks_in_every_runtime(small, cfd_root):
    from crackseg.images import load_image

    photos = sorted((cfd_root / "images").iterdir())[:2]
    torch_model = load_model(small / "model.pt")
    for path in (small / "m.onnx", small / "m.xml"):
        runtime = load_inference_model(path)
        for photo in photos:
            image = load_image(photo)[None]
            expected = _torch_probabilities(torch_model, image)
            got = runtime(image).numpy()
            assert np.abs(got - expected).max() < 1e-3
            assert ((got >= 0.37) == (expected >= 0.37)).mean() >= 0.999


@isolated
def test_openvino_runs_in_bf16_on_request_and_the_other_runtimes_refuse_it(tmp_path, small, cfd_root):
    import contextlib
    import io

    import openvino

    from crackseg.images import load_image

    if "BF16" not in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU has no bfloat16")
    image = load_image(sorted((cfd_root / "images").iterdir())[0])[None]
    f32 = load_inference_model(small / "m.xml")(image).numpy()
    bf16 = load_inference_model(small / "m.xml", amp="bf16")(image).numpy()
    assert 0 < np.abs(bf16 - f32).max() < 0.1  # bf16 really ran, and stays close
    assert ((bf16 >= 0.37) == (f32 >= 0.37)).mean() >= 0.99
    (tmp_path / "in").mkdir()
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "in" / "a.png")
    assert main(["predict", str(tmp_path / "in"), "--model", str(small / "m.xml"), "--amp", "bf16", "--out", str(tmp_path / "ok")]) == 0
    for model, amp in [(small / "m.onnx", "bf16"), (small / "m.xml", "fp16")]:
        with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(io.StringIO()) as stderr:
            main(["predict", str(tmp_path / "in"), "--model", str(model), "--amp", amp, "--out", str(tmp_path / "refused")])
        assert exit.value.code == 2 and stderr.getvalue().count("\n") == 1 and "float32" in stderr.getvalue()
        assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("content", [b"", b"not a model at all", b"\x08\x01\x12\x04junk"])
@isolated
def test_broken_files_are_one_line_errors_for_export_and_predict(tmp_path, small, content):
    import contextlib
    import io

    for name in ("broken.pt", "broken.onnx", "broken.xml"):
        (tmp_path / name).write_bytes(content)
    (tmp_path / "in").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "in" / "a.png")
    commands = [["export", str(tmp_path / "broken.pt"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]]
    commands += [["predict", str(tmp_path / "in"), "--model", str(tmp_path / name), "--out", str(tmp_path / f"o{name}")]
                 for name in ("broken.pt", "broken.onnx", "broken.xml")]
    for args in commands:
        with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(io.StringIO()) as stderr:
            main(args)
        err = stderr.getvalue()
        assert exit.value.code == 2 and err.count("\n") == 1 and "broken" in err and "Traceback" not in err, (args, err)


def test_a_missing_runtime_names_the_pip_install(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(InputError, match=r"onnxruntime is not installed; pip install 'crackseg\[onnx\]'"):
        load_inference_model(small / "m.onnx")
