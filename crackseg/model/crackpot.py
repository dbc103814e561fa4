"""crackpot's MIT-licensed Keras ResUNet turned into a crackseg model file, without Keras.

crackpot 2.0 (a GPL-3.0 crack-measuring application) ships ``resources/model/my_model.keras``, a deep residual UNet
trained on Crack500 and DeepCrack whose weights are MIT-licensed (``resources/license/model_MIT_LICENSE.txt``). A
``.keras`` file is a zip of ``config.json`` (the layer graph) and ``model.weights.h5`` (each layer's variables under
``layers/KEY/vars/I``, KEY numbering the layers of a kind in the graph's order: ``conv2d``, ``conv2d_1``, ...). The graph
names layers of a kind in the order they were created, the order :class:`crackseg.model.resunet.ResUNet` declares its
modules in, so the two are paired in that order and every pair checked by kind, size and shape. crackpot feeds RGB divided by 255, resized to 256x256, and reads 0.5 as
its threshold; the model file keeps the scaling and the threshold, ``predict --resize 256`` does the resizing.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from crackseg.core.errors import InputError, require
from crackseg.model.checkpoint import check_model_out, save_model
from crackseg.model.networks import CrackSegModel, build_model
from crackseg.model.shipped import crackpot_model_file

THRESHOLD = 0.5  # crackpot's own (its Dice and IoU metrics binarize at 0.5)
# The layers of crackpot's ResUNet graph, by kind
_LAYER_KINDS = Counter({"Conv2D": 30, "BatchNormalization": 28, "Activation": 19, "Add": 9, "UpSampling2D": 4, "Concatenate": 4,
                        "InputLayer": 1})


def convert_crackpot(source: Path | None, out: Path, threshold: float | None = None, overwrite: bool = False) -> CrackSegModel:
    """Write the crackseg model of crackpot's ``my_model.keras`` (``source``; None: the installed crackpot's) to ``out``."""
    check_model_out(Path(out), overwrite)
    source = Path(source) if source is not None else crackpot_model_file()
    config, weights = _read_keras(source)
    model = build_model(arch="resunet")
    _load_layers(model.net, config, weights, source)
    model.mean.zero_()
    model.std.fill_(1.0)
    model.threshold = THRESHOLD if threshold is None else threshold
    save_model(model, Path(out), converted_from={"path": str(source), "from": "crackpot", "licence": "MIT"})
    return model.eval()


def _read_keras(source: Path) -> tuple[dict, dict[str, list]]:
    """(the layer graph, {layer name: its variables as arrays}) of a ``.keras`` file."""
    h5py = require("h5py", "crackpot")
    try:
        with zipfile.ZipFile(source) as archive:
            config = json.loads(archive.read("config.json"))
            weights = io.BytesIO(archive.read("model.weights.h5"))
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, OSError) as error:
        raise InputError(f"{source}: not a Keras 3 model file (.keras with config.json and model.weights.h5): {error}") from None
    try:
        with h5py.File(weights, "r") as h5:
            layers = h5["layers"]
            variables = {name: [layers[name]["vars"][str(i)][()] for i in range(len(layers[name]["vars"]))]
                         for name in layers if "vars" in layers[name]}
    except (OSError, KeyError) as error:
        raise InputError(f"{source}: its model.weights.h5 is not readable Keras weights: {error}") from None
    return config, variables


def _keras_layers(config: dict, kind: str, source: Path) -> list[tuple[str, dict]]:
    """(weights key, layer) of the graph's layers of ``kind``, in the order they were created (by their names).

    The weights file keys layers by their place in the graph's list, as Keras's saving does; the names in the graph
    count in creation order.
    """
    try:
        layers = [layer for layer in config["config"]["layers"] if layer["class_name"] == kind]
    except (KeyError, TypeError):
        raise InputError(f"{source}: its config.json holds no Keras layer graph") from None
    snake = re.sub("([a-z])([A-Z])", r"\1_\2", re.sub("(.)([A-Z][a-z]+)", r"\1_\2", kind)).lower()  # Keras's snake case
    keyed = [(snake if index == 0 else f"{snake}_{index}", layer) for index, layer in enumerate(layers)]

    def number(layer: dict) -> int:
        match = re.fullmatch(r"[a-z0-9_]*?(?:_(\d+))?", layer.get("name", ""))
        if match is None:
            raise InputError(f"{source}: layer name {layer.get('name')!r} is not one Keras gave")
        return int(match.group(1) or 0)

    return sorted(keyed, key=lambda pair: number(pair[1]))


def _check_graph(config: dict, epsilon: float, source: Path) -> None:
    """Refuse a graph whose layers compute otherwise than crackpot's, whatever its weights: another kind or number of
    layers, a batch norm's epsilon, an upsampling's interpolation, an activation, a convolution's padding or dilation."""
    layers = config["config"]["layers"]
    kinds = Counter(layer.get("class_name") for layer in layers)
    if kinds != _LAYER_KINDS:
        extra = sorted((kinds - _LAYER_KINDS) + (_LAYER_KINDS - kinds))
        raise InputError(f"{source}: its layers ({', '.join(f'{kinds[kind]} {kind}' for kind in extra)}) are not those of crackpot's "
                         "ResUNet; crackseg converts crackpot's own model")
    for layer in layers:
        settings, kind = layer.get("config", {}), layer["class_name"]
        expected = {"BatchNormalization": {"epsilon": epsilon, "center": True, "scale": True, "axis": -1},
                    "UpSampling2D": {"interpolation": "nearest", "size": [2, 2]}, "Activation": {"activation": "relu"},
                    "Conv2D": {"padding": "same", "dilation_rate": [1, 1], "groups": 1, "use_bias": True}}.get(kind, {})
        for name, value in expected.items():
            found = settings.get(name, value)
            if found != value and not (isinstance(value, float) and isinstance(found, float) and math.isclose(found, value)):
                raise InputError(f"{source}: layer {layer.get('name')} has {name} {found!r}, where crackpot's ResUNet has {value!r}")


def _load_layers(net: nn.Module, config: dict, weights: dict[str, list], source: Path) -> None:
    convs = [module for module in net.modules() if isinstance(module, nn.Conv2d)]
    norms = [module for module in net.modules() if isinstance(module, nn.BatchNorm2d)]
    keras_convs, keras_norms = _keras_layers(config, "Conv2D", source), _keras_layers(config, "BatchNormalization", source)
    if (len(keras_convs), len(keras_norms)) != (len(convs), len(norms)):
        raise InputError(f"{source}: {len(keras_convs)} convolutions and {len(keras_norms)} batch norms, not the "
                         f"{len(convs)} and {len(norms)} of crackpot's ResUNet")
    _check_graph(config, norms[0].eps, source)
    activations = [layer["config"].get("activation") for _, layer in keras_convs]
    if activations != ["linear"] * (len(convs) - 1) + ["sigmoid"]:
        raise InputError(f"{source}: its convolutions' activations are not crackpot's (linear, then a sigmoid at the output)")
    state = {}
    names = {module: name for name, module in net.named_modules()}
    for module, (key, layer) in zip(convs, keras_convs):
        kernel, bias = _variables(weights, key, layer, 2, source)
        stride = tuple(layer["config"].get("strides", (1, 1)))
        if kernel.shape != (*module.kernel_size, module.in_channels, module.out_channels) or stride != module.stride:
            raise InputError(f"{source}: layer {layer['name']} (kernel {kernel.shape}, strides {stride}) is not crackpot's "
                             f"{names[module]} ({module.kernel_size}, {module.in_channels} -> {module.out_channels}, {module.stride})")
        state[f"{names[module]}.weight"] = torch.from_numpy(kernel).permute(3, 2, 0, 1)
        state[f"{names[module]}.bias"] = torch.from_numpy(bias)
    for module, (key, layer) in zip(norms, keras_norms):
        variables = _variables(weights, key, layer, 4, source)
        if any(value.shape != (module.num_features,) for value in variables):
            raise InputError(f"{source}: layer {layer['name']} does not normalize the {module.num_features} channels of {names[module]}")
        for key, value in zip(("weight", "bias", "running_mean", "running_var"), variables):
            state[f"{names[module]}.{key}"] = torch.from_numpy(value)
    state |= {key: value for key, value in net.state_dict().items() if key.endswith("num_batches_tracked")}
    net.load_state_dict(state, strict=True)


def _variables(weights: dict[str, list], key: str, layer: dict, count: int, source: Path) -> list:
    variables = weights.get(key)
    if variables is None or len(variables) != count:
        raise InputError(f"{source}: layer {layer['name']} has {0 if variables is None else len(variables)} variables in "
                         f"model.weights.h5, not {count}")
    return variables
