"""Exported models: ONNX / OpenVINO equal torch, carry their metadata, and predict like checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import crackseg
from crackseg.model.checkpoint import load_model, save_model
from crackseg.cli.main import main
from crackseg.model.options import InferenceOptions
from crackseg.core.errors import InputError
from crackseg.model.export import export_model
from crackseg.model.runtimes import choose_runtime, load_runtime
from conftest import csv_rows, isolated

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")


def _load(path, **options):
    """The model that predict and evaluate run for ``path`` (an exported model: its runtime's callable)."""
    return load_runtime(choose_runtime(path, InferenceOptions(**options))).model


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


@pytest.mark.parametrize("arch, encoder", [("unet", "mobilenet_v2"), ("unet", "efficientnet-b0"), ("unet", "efficientnet-lite0"),
                                           ("unet16", None), ("unet_resnet34", None), ("resunet", None)])
@pytest.mark.slow
@isolated
def test_every_architecture_exports_and_equals_torch_at_odd_sizes(tmp_path, arch, encoder):
    torch.manual_seed(1)
    model = crackseg.build_model(encoder, arch=arch).eval()
    save_model(model, tmp_path / "model.pt")
    export_model(tmp_path / "model.pt", "onnx", tmp_path / "model.onnx")
    # OpenVINO runs the ONNX graph here as its IR writer converts it (one frontend); the IR files are tested in `small`.
    runtimes = [_load(tmp_path / "model.onnx", backend=backend) for backend in ("onnxruntime", "openvino")]
    for shape in [(1, 3, 67, 93), (2, 3, 40, 130)]:
        images = torch.randint(0, 256, shape, dtype=torch.uint8)
        expected = _torch_probabilities(model, images)
        for backend, runtime in zip(("onnxruntime", "openvino"), runtimes):
            got = runtime(images).numpy()
            assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-3, (backend, shape)


@isolated
def test_the_input_is_float_in_0_1_and_an_older_uint8_export_still_runs_either_input(tmp_path, small):
    import onnx

    from crackseg.model.export import _onnx_graph, _Probabilities, metadata

    graph = onnx.load(str(small / "m.onnx"))
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    model = crackseg.load_model(small / "model.pt")
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "probabilities": {0: "batch", 2: "height", 3: "width"}}
    older = _onnx_graph(_Probabilities(model), torch.zeros((1, 3, 35, 69), dtype=torch.uint8), axes, metadata(model))
    (tmp_path / "older.onnx").write_bytes(older)
    images = torch.randint(0, 256, (2, 3, 50, 70), dtype=torch.uint8)
    expected = _torch_probabilities(model, images)
    for path in (small / "m.onnx", tmp_path / "older.onnx"):
        for backend in ("onnxruntime", "openvino"):
            runtime = _load(path, backend=backend)
            assert np.abs(runtime(images).numpy() - expected).max() < 1e-5, (path.name, backend)
            assert np.abs(runtime(images.float() / 255).numpy() - expected).max() < 1e-5, (path.name, backend)  # as torch takes


@isolated
def test_metadata_travels_with_the_exported_files(small):
    import onnx

    onnx.checker.check_model(str(small / "m.onnx"))
    props = {p.key: p.value for p in onnx.load(str(small / "m.onnx")).metadata_props}
    assert props["crackseg_version"] == crackseg.__version__ and props["arch"] == "unet" and props["encoder"] == "mobilenet_v2"
    for path, backend in [(small / "m.onnx", "onnxruntime"), (small / "m.xml", "openvino"), (small / "m.onnx", "openvino")]:
        runtime = _load(path, backend=backend)
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
    with pytest.raises(InputError, match="do not match the checksum saved with them"):  # the settings are under the checksum
        load_model(tmp_path / "st")
    import safetensors.torch

    from crackseg.model.checkpoint import model_digest

    config["sha256"] = model_digest(config["model"], safetensors.torch.load_file(str(tmp_path / "st" / "model.safetensors")))
    (tmp_path / "st" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as caught:  # a consistent file of the wrong shape: still one line
        load_model(tmp_path / "st")
    assert "do not fit the unet model with the resnet18 encoder" in str(caught.value) and "\n" not in str(caught.value)
    assert load_model(tmp_path / "classic_st").arch == "unet16"


def _classic_file(tmp_path):
    torch.manual_seed(2)
    save_model(crackseg.build_model(arch="unet16"), tmp_path / "unet16.pt")
    return tmp_path / "unet16.pt"


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
                     "--save-prob", "16", "--tile", "128", "--overlap", "32", "--tta", "d4", "--batch-size", "3", "--device", "cpu"]) == 0
    for name in runs:
        for index in range(3):
            reference = np.asarray(Image.open(tmp_path / "torch" / "probs" / f"{index}.png"), dtype=np.float64) / 65535
            probs = np.asarray(Image.open(tmp_path / name / "probs" / f"{index}.png"), dtype=np.float64) / 65535
            masks = [np.asarray(Image.open(tmp_path / run / "masks" / f"{index}.png")) for run in ("torch", name)]
            assert np.abs(probs - reference).max() < 1e-3 and (masks[0] == masks[1]).mean() >= 0.999, (name, index)
        assert len(csv_rows(tmp_path / name / "predictions.csv")) == 3


@isolated
def test_evaluate_scores_an_exported_model_as_its_checkpoint(tmp_path, small):
    import json

    from crackseg.data.synth import write_dataset

    write_dataset(tmp_path / "data", count=3, size=(64, 96), seed=5)
    reports = {}
    for name, model in {"torch": small / "model.pt", "onnx": small / "m.onnx", "xml": small / "m.xml"}.items():
        assert main(["evaluate", "--checkpoint", str(model), "--data", str(tmp_path / "data"), "--split", "all",
                     "--out", str(tmp_path / name), "--tta", "flip", "--device", "cpu"]) == 0
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    expected = reports["torch"]
    for name in ("onnx", "xml"):
        got = reports[name]
        assert got["threshold"] == expected["threshold"] and got["images"] == 3, name  # the file's own threshold
        for key in ("precision", "recall", "f1", "miou"):
            assert abs(got["dataset"][key] - expected["dataset"][key]) < 0.005, (name, key)
        assert abs(got["ap"] - expected["ap"]) < 0.005, name


@isolated
def test_real_photos_give_the_same_masks_in_every_runtime(small, cfd_root):
    from crackseg.data.images import load_image

    photos = sorted((cfd_root / "images").iterdir())[:2]
    torch_model = load_model(small / "model.pt")
    for path in (small / "m.onnx", small / "m.xml"):
        runtime = _load(path)
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

    from crackseg.data.images import load_image

    if "BF16" not in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU has no bfloat16")
    image = load_image(sorted((cfd_root / "images").iterdir())[0])[None]
    f32 = _load(small / "m.xml")(image).numpy()
    bf16 = _load(small / "m.xml", amp="bf16")(image).numpy()
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
        _load(small / "m.onnx")


def _one_line_error(args) -> str:
    """The one line that ``crackseg ARGS`` prints for a user's mistake (exit status 2)."""
    import contextlib
    import io

    with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(io.StringIO()) as stderr:
        main(list(map(str, args)))
    err = stderr.getvalue()
    assert exit.value.code == 2 and err.startswith("crackseg: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _predict_error(tmp_path, model, *extra) -> str:
    (tmp_path / "in").mkdir(exist_ok=True)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "in" / "a.png")
    return _one_line_error(["predict", tmp_path / "in", "--model", model, "--out", tmp_path / "out", *extra])


def _flip_a_byte_inside(path, chunk: bytes) -> None:
    """Flip one bit in the middle of ``chunk`` where it lies in the file ``path``: a damaged disk or download."""
    data = bytearray(path.read_bytes())
    data[data.index(chunk) + len(chunk) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _edit_onnx_metadata(source, out, **changes):
    """A copy of an ONNX file with metadata values changed (None: removed), as a user or another tool would."""
    import onnx

    graph = onnx.load(str(source))
    props = {entry.key: entry.value for entry in graph.metadata_props}
    props.update(changes)
    del graph.metadata_props[:]
    for key, value in props.items():
        if value is not None:
            entry = graph.metadata_props.add()
            entry.key, entry.value = key, value
    onnx.save(graph, str(out))
    return out


@isolated
def test_a_damaged_or_edited_onnx_file_is_refused(tmp_path, small):
    import shutil

    import onnx

    damaged = shutil.copy(small / "m.onnx", tmp_path / "damaged.onnx")
    largest = max(onnx.load(str(damaged)).graph.initializer, key=lambda tensor: len(tensor.raw_data))
    _flip_a_byte_inside(damaged, largest.raw_data[:4096])
    for backend in ("onnxruntime", "openvino"):
        err = _predict_error(tmp_path, damaged, "--backend", backend)
        assert "damaged.onnx: its weights, graph or settings do not match the checksum" in err and "export it again" in err
    edits = {"threshold": ("0.05", "do not match the checksum"), "size_divisor": ("64", "do not match the checksum"),
             "sha256": (None, "has no checksum"), "encoder": ("resnet34", "do not match the checksum")}
    for key, (value, message) in edits.items():
        edited = _edit_onnx_metadata(small / "m.onnx", tmp_path / f"{key}.onnx", **{key: value})
        assert message in _predict_error(tmp_path, edited), key
        with pytest.raises(InputError, match=message):
            _load(edited, backend="openvino")
    assert _load(small / "m.onnx").threshold == 0.37  # the file as exported runs


@pytest.mark.parametrize("key, value, message", [
    ("threshold", "nan", "threshold 'nan' is not a number in"), ("threshold", "abc", "threshold 'abc' is not a number in"),
    ("threshold", "7", r"threshold '7' is not a number in \[0, 1\]"), ("threshold", None, "its metadata lacks threshold"),
    ("size_divisor", "abc", "size_divisor 'abc' is not a positive whole number"), ("size_divisor", "0", "size_divisor '0' is not"),
])
@isolated
def test_unusable_metadata_values_are_one_line_errors(tmp_path, small, key, value, message):
    edited = _edit_onnx_metadata(small / "m.onnx", tmp_path / "edited.onnx", **{key: value})
    err = _predict_error(tmp_path, edited)
    assert "edited.onnx: its " in err and "export it again" in err
    import re

    assert re.search(message, err), err
    with pytest.raises(InputError, match=message):
        _load(edited, backend="openvino")


def test_a_damaged_or_edited_openvino_model_is_refused(tmp_path, small):
    import shutil

    xml = shutil.copy(small / "m.xml", tmp_path / "m.xml")
    shutil.copy(small / "m.bin", tmp_path / "m.bin")
    assert _load(xml).threshold == 0.37
    text = xml.read_text()
    assert text.count('<threshold value="0.37" />') == 2  # crackseg's rt_info, and the ONNX metadata OpenVINO keeps
    for edit, message in [('<threshold value="0.05" />', "do not match the checksum"), ('<threshold value="nan" />', "threshold 'nan'")]:
        xml.write_text(text.replace('<threshold value="0.37" />', edit))
        assert message in _predict_error(tmp_path, xml)
    xml.write_text("\n".join(line for line in text.splitlines() if "<sha256 " not in line))
    assert "m.xml: has no checksum" in _predict_error(tmp_path, xml)
    xml.write_text(text)
    weights = tmp_path / "m.bin"
    _flip_a_byte_inside(weights, weights.read_bytes())
    assert "do not match the checksum" in _predict_error(tmp_path, xml)
    weights.unlink()
    err = _predict_error(tmp_path, xml)
    assert "m.xml: its weights file m.bin is missing" in err and "core.cpp" not in err


def test_export_keeps_an_existing_bin_and_refuses_exported_models_as_input(tmp_path, small):
    (tmp_path / "m.bin").write_bytes(b"someone else's weights")
    err = _one_line_error(["export", small / "model.pt", "--format", "openvino", "--out", tmp_path / "m.xml"])
    assert "m.bin already exists; choose another --out or pass --overwrite" in err
    assert (tmp_path / "m.bin").read_bytes() == b"someone else's weights" and not (tmp_path / "m.xml").exists()
    assert main(["export", str(small / "model.pt"), "--format", "openvino", "--out", str(tmp_path / "m.xml"), "--overwrite"]) == 0
    assert _load(tmp_path / "m.xml").threshold == 0.37
    assert "an OpenVINO model is an .xml file" in _one_line_error(
        ["export", small / "model.pt", "--format", "openvino", "--out", tmp_path / "n.bin"])
    for exported, what in [(small / "m.onnx", "an exported ONNX model"), (small / "m.xml", "an exported OpenVINO model")]:
        err = _one_line_error(["export", exported, "--format", "onnx", "--out", tmp_path / "again.onnx"])
        assert f"{what}, not a crackseg checkpoint" in err and "weights_only" not in err and "Re-running" not in err


@pytest.mark.parametrize("name, backend", [("m.onnx", "auto"), ("m.xml", "openvino"), ("m.onnx", "onnxruntime")])
def test_compile_with_an_exported_model_is_a_one_line_error(name, backend):
    with pytest.raises(InputError, match=f"--compile applies to --backend torch; {'openvino' if backend == 'openvino' else 'onnxruntime'}"):
        choose_runtime(Path(name), InferenceOptions(backend=backend, compile=True))


def _full_disk_at(monkeypatch, calls: int) -> None:
    """Writing a whole file fails as a full disk does (naming no file) from the ``calls``-th file on."""
    import errno

    write, seen = Path.write_bytes, []

    def filling(self, content):
        seen.append(self)
        if len(seen) >= calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, content)

    monkeypatch.setattr(Path, "write_bytes", filling)


def _exit_one(args) -> str:
    import contextlib
    import io

    with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(io.StringIO()) as stderr:
        main(list(map(str, args)))
    err = stderr.getvalue()
    assert exit.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_safetensors_export_that_fails_halfway_changes_nothing(tmp_path, small, monkeypatch):
    """Both files are written whole before either takes its name: a full disk at the config leaves the old folder as it
    was, and a new folder is not left behind empty."""
    before = {path.name: path.read_bytes() for path in (small / "st").iterdir()}
    (tmp_path / "st").mkdir()
    for name, content in before.items():
        (tmp_path / "st" / name).write_bytes(content)
    (tmp_path / "st" / "README.md").write_text("the user's")
    _full_disk_at(monkeypatch, calls=2)
    err = _exit_one(["export", small / "model.pt", "--format", "safetensors", "--out", tmp_path / "st", "--overwrite", "--half"])
    assert "No space left on device" in err and str(tmp_path / "st") in err
    assert {path.name: path.read_bytes() for path in (tmp_path / "st").iterdir() if path.name != "README.md"} == before
    assert (tmp_path / "st" / "README.md").read_text() == "the user's"
    _exit_one(["export", small / "model.pt", "--format", "safetensors", "--out", tmp_path / "new"])
    assert not (tmp_path / "new").exists()


def test_an_openvino_save_that_fails_is_one_line_naming_the_file(tmp_path, small, monkeypatch):
    import openvino

    def failing(*args, **kwargs):
        raise RuntimeError("basic_ios::clear: iostream error")

    monkeypatch.setattr(openvino, "save_model", failing)
    err = _exit_one(["export", small / "model.pt", "--format", "openvino", "--out", tmp_path / "m.xml"])
    assert f"{tmp_path / 'm.xml'}: OpenVINO could not write it" in err
    assert not list(tmp_path.iterdir())


def test_half_refuses_weights_beyond_float16(tmp_path):
    torch.manual_seed(0)
    model = crackseg.build_model("mobilenet_v2")
    batch_norm = next(module for module in model.net.modules() if isinstance(module, torch.nn.BatchNorm2d))
    batch_norm.running_var[0] = 1e6  # float16 stops at 65504
    save_model(model, tmp_path / "model.pt")
    err = _one_line_error(["export", tmp_path / "model.pt", "--format", "safetensors", "--out", tmp_path / "st", "--half"])
    assert "running_var holds 1e+06, beyond float16's 65504" in err and not (tmp_path / "st").exists()


def test_an_openvino_bin_or_a_folder_for_an_exported_runtime_says_what_to_give(tmp_path, small):
    (tmp_path / "photo.png").write_bytes(b"")
    err = _one_line_error(["predict", "--model", small / "m.bin", tmp_path / "photo.png", "--out", tmp_path / "out"])
    assert f"the weights of an OpenVINO model; give its .xml: {small / 'm.xml'}" in err
    for backend in ("openvino", "onnxruntime"):
        err = _one_line_error(["predict", "--model", small / "st", "--backend", backend, tmp_path / "photo.png", "--out", tmp_path / "out"])
        assert f"{small / 'st'}: a folder; --backend {backend} runs an exported file" in err


@pytest.mark.parametrize("fmt, out, example", [("safetensors", ".", "--out model"), ("onnx", "..", "--out model.onnx"),
                                               ("onnx", ".onnx", "--out model.onnx"), ("openvino", "x/.xml", "--out model.xml")])
def test_an_out_without_a_name_is_given_an_example_of_its_format(small, fmt, out, example):
    with pytest.raises(InputError, match="give the exported model's name, e.g. (.*)") as caught:
        export_model(small / "model.pt", fmt, Path(out))
    assert str(caught.value).endswith(f"e.g. {example}")


def test_a_file_of_a_safetensors_folder_or_a_folder_for_a_file_says_what_to_give(tmp_path, small):
    (tmp_path / "photo.png").write_bytes(b"")
    for part in ("model.safetensors", "config.json"):
        err = _one_line_error(["predict", "--model", small / "st" / part, tmp_path / "photo.png", "--out", tmp_path / "out"])
        assert f"one file of a safetensors model folder; give the folder: {small / 'st'}" in err
    err = _one_line_error(["convert", small / "st", "--arch", "unet16", "--out", tmp_path / "m.pt"])
    assert f"{small / 'st'}: a folder, not a" in err


def test_a_refused_or_failed_export_leaves_no_folder_it_made(tmp_path, small, monkeypatch):
    err = _one_line_error(["export", small / "model.pt", "--format", "onnx", "--tile", "100", "--out", tmp_path / "new" / "sub" / "m.onnx"])
    assert "--tile 100 px is not a multiple of 32" in err and not (tmp_path / "new").exists()
    monkeypatch.setitem(sys.modules, "openvino", None)
    err = _one_line_error(["export", small / "model.pt", "--format", "openvino", "--out", tmp_path / "new" / "m.xml"])
    assert "pip install 'crackseg[openvino]'" in err and not (tmp_path / "new").exists()


def _checksum_of(xml: Path) -> str:
    import re

    return re.search(r'<sha256 value="([0-9a-f]{64})" />', xml.read_text())[1]


def test_an_edited_openvino_graph_or_an_earlier_checksum_over_the_weights_alone_is_refused(tmp_path, small):
    import shutil

    from crackseg.model.runtimes import exported_digest

    xml = shutil.copy(small / "m.xml", tmp_path / "m.xml")
    shutil.copy(small / "m.bin", tmp_path / "m.bin")
    text = xml.read_text()
    assert text.count('type="Sigmoid"') == 1
    xml.write_text(text.replace('type="Sigmoid"', 'type="Relu"'))  # still a model OpenVINO runs, and a wrong one
    assert "its weights, graph or settings do not match the checksum" in _predict_error(tmp_path, xml)
    info = {key: value.astype(str) for key, value in load_runtime_info(small / "m.xml").items()}
    earlier = exported_digest(info, [(tmp_path / "m.bin").read_bytes()])
    xml.write_text(text.replace(_checksum_of(small / "m.xml"), earlier))
    err = _predict_error(tmp_path, xml)
    assert "m.xml: exported by an earlier crackseg, whose checksum leaves out the model's graph; export it again" in err


def load_runtime_info(xml: Path) -> dict:
    import openvino

    return openvino.Core().read_model(str(xml)).get_rt_info(["crackseg"]).astype(dict)


def test_an_xml_that_is_not_openvino_or_an_openvino_model_for_onnxruntime_says_what_to_give(tmp_path, small):
    (tmp_path / "annotations.xml").write_text('<?xml version="1.0" encoding="utf-8"?>\n<annotations><version>1.1</version></annotations>\n')
    err = _predict_error(tmp_path, tmp_path / "annotations.xml")
    assert "annotations.xml: not an OpenVINO model" in err and "annotations.bin" not in err
    err = _predict_error(tmp_path, small / "m.xml", "--backend", "onnxruntime")
    assert "ONNX Runtime needs an .onnx file; make one with crackseg export CHECKPOINT --format onnx" in err


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_runtime_out_of_memory_is_a_memory_error(small, backend):
    """Run in a process of its own whose address space ends 256 MiB past what it holds once the model is loaded: a 2048 px
    image needs more inside the runtime."""
    import subprocess

    script = f"""
import resource, sys, torch
from crackseg.model.options import InferenceOptions
from crackseg.model.runtimes import choose_runtime, load_runtime
model = load_runtime(choose_runtime({str(small / 'm.onnx')!r}, InferenceOptions(backend={backend!r}))).model
images = torch.zeros((1, 3, 2048, 2048), dtype=torch.uint8)
size = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
try:
    model(images)
except MemoryError as error:
    print("MemoryError:", error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith(f"MemoryError: {backend}: "), (done.stdout, done.stderr[-2000:])
    assert "allocat" in done.stdout.lower() and "Traceback" not in done.stderr, done.stderr[-2000:]
