"""The training loop: ``fit(config)`` -> ``train_one_epoch`` / ``evaluate`` -> checkpoints, TensorBoard.

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

Every process computes; rank 0 alone prints, logs and writes. The run folder holds
``config.json``, ``split.json``, ``epoch_NNNN.pt`` (the last K), ``last.pt``, ``best.pt``,
TensorBoard events and ``train.log``; ``--resume auto`` continues from ``last.pt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, SequentialSampler, Subset
from tqdm import tqdm

import crackseg
from crackseg import distributed
from crackseg.checkpoint import FORMAT, VERSION, model_payload, read_checkpoint, save_atomic, unwrap
from crackseg.data import (
    CrackDataset,
    EpochSampler,
    crack_pixel_weight,
    load_split,
    make_loader,
    make_split,
    open_dataset,
    pad_collate,
    save_split,
    usable_samples,
)
from crackseg.errors import InputError, RunError
from crackseg.files import write_atomic
from crackseg.losses import CrackLoss
from crackseg.metrics import BINS, best_f1, counts_by_threshold, scores_at, threshold_histograms
from crackseg.models import build_model, enable_activation_checkpointing
from crackseg.transforms import PhotometricJitter, train_transform

log = logging.getLogger("crackseg.train")

# Options that may change when a run is resumed; any other difference is an error.
RESUMABLE_CHANGES = {"run", "epochs", "workers", "val_every", "keep_last", "log_every", "resume", "device", "cache", "val_batch_size"}


@dataclass
class TrainConfig:
    run: str
    data: str | None = None
    images: str | None = None
    masks: str | None = None
    mask_pattern: str = "{stem}"
    val_fraction: float = 0.1
    on_bad_sample: str = "error"
    cache: bool = False
    arch: str = "unet"
    encoder: str | None = "resnet34"
    encoder_weights: str = "imagenet"
    init: str | None = None
    epochs: int = 50
    batch_size: int = 8
    val_batch_size: int | None = None
    lr: float = 3e-4
    base_batch: int = 16
    lr_scaling: str = "linear"
    optimizer: str = "adamw"
    weight_decay: float = 1e-4
    scheduler: str = "cosine"
    warmup_epochs: float = 1.0
    crop_size: int = 384
    amp: str = "auto"
    channels_last: bool = False
    compile: bool = False
    sync_bn: bool = False
    grad_accum: int = 1
    activation_checkpointing: bool = False
    strategy: str = "ddp"
    loss: str = "bce"
    pos_weight: str = "auto"
    pos_weight_scale: float = 1.0
    clip_grad: float | None = None
    val_every: int = 1
    keep_last: int = 3
    resume: str = "auto"
    seed: int = 0
    workers: int | None = None
    monitor: str = "f1"
    device: str = "auto"
    log_every: int = 10


@dataclass
class Validation:
    loss: float
    histograms: torch.Tensor  # (3, BINS) int64 (see crackseg.metrics), summed over every process
    samples: torch.Tensor | None = None  # (K, 3, H, W) uint8 overlays from rank 0's first batch

    def metrics(self) -> dict[str, float]:
        best = best_f1(self.histograms)
        fixed = scores_at(self.histograms, 0.5)
        return {
            "loss": self.loss,
            "f1": best.f1,
            "iou": best.iou,
            "precision": best.precision,
            "recall": best.recall,
            "threshold": best.threshold,
            "f1_at_0.5": fixed.f1,
            "iou_at_0.5": fixed.iou,
        }


def fit(config: TrainConfig) -> dict:
    """Train as configured, resuming where the run folder says; returns the best score and run folder."""
    env = distributed.setup(config.device)
    try:
        return _fit(config, env)
    finally:
        distributed.teardown()


def _fit(config: TrainConfig, env: distributed.Environment) -> dict:
    _check_options(config, env)
    run = Path(config.run)
    resume_from = _decided_on_main(env, _find_resume_source, run, config)
    payload = read_checkpoint(resume_from) if resume_from else None
    if payload is not None:
        _check_same_run(config, payload["config"]["options"], resume_from)
    resolved, split, samples = _decided_on_main(env, _scan_and_split, config, env, run, payload)
    with _logging_to(run if env.is_main else None):
        if resume_from:
            log.info(f"resuming from {resume_from} (epoch {payload['epoch']} done)")
        return _train(config, env, run, payload, resolved, split, samples)


def _train(config, env, run, payload, resolved, split, samples) -> dict:
    if payload is not None and payload["epoch"] >= config.epochs:
        if env.is_main:
            log.info(f"{run}: all {config.epochs} epochs are done; nothing to train (raise --epochs to continue)")
        return {"run": str(run), "best": payload["best"], "epochs_run": 0}

    torch.manual_seed(config.seed)
    start_from = payload or (read_checkpoint(Path(config.init)) if config.init else None)
    encoder_weights = None if start_from is not None or config.encoder_weights == "none" else config.encoder_weights
    model = build_model(config.encoder, encoder_weights, config.arch)
    if start_from is not None:
        saved = start_from["model"]["config"]
        if (saved["arch"], saved["encoder"]) != (model.arch, model.encoder):
            raise InputError(
                f"{config.init}: holds a {saved['arch']} model with the {saved['encoder']} encoder; "
                f"pass --arch {saved['arch']}" + (f" --encoder {saved['encoder']}" if saved["arch"] == "unet" else "")
            )
        model.load_state_dict(start_from["model"]["state_dict"])
        model.threshold = saved["threshold"]
    model.to(env.device)
    if config.activation_checkpointing:
        enable_activation_checkpointing(model)
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
    if config.sync_bn and env.distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model_without_ddp = model
    if config.compile:
        model.compile()
    if env.distributed:
        model = DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    elif config.strategy == "dp":
        model = nn.DataParallel(model)

    train_set = CrackDataset(_subset(samples, split["train"]), train_transform(config.crop_size), seed=config.seed, cache=config.cache)
    val_set = CrackDataset(_subset(samples, split["val"]), cache=config.cache)
    workers = resolved["workers"]
    pin = env.device.type == "cuda"
    train_sampler = EpochSampler(
        DistributedSampler(train_set, env.world_size, env.rank, shuffle=True, seed=config.seed, drop_last=True)
    )
    train_loader = make_loader(train_set, config.batch_size, train_sampler, workers, pin, drop_last=True)
    val_shard = Subset(val_set, list(range(env.rank, len(val_set), env.world_size)))
    val_loader = make_loader(
        val_shard, config.val_batch_size or config.batch_size, SequentialSampler(val_shard), workers, pin, collate_fn=pad_collate
    )
    steps_per_epoch = len(train_loader) // config.grad_accum
    if steps_per_epoch == 0:
        raise InputError(
            f"{len(split['train'])} training images give no full step of {config.grad_accum} x {config.batch_size} images "
            f"on each of {env.world_size} processes; lower --batch-size or --grad-accum"
        )

    optimizer = _build_optimizer(config, model_without_ddp, resolved["lr"])
    scheduler = _build_scheduler(config, optimizer, steps_per_epoch)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[resolved["amp"]]
    scaler = torch.amp.GradScaler(env.device.type, enabled=amp_dtype == torch.float16)
    loss_fn = CrackLoss(resolved["pos_weight"], dice=config.loss == "bce+dice")
    best = {"metric": config.monitor, "score": None, "epoch": None}
    start_epoch, global_step = 1, 0
    if payload is not None:
        restore_training_state(payload, optimizer, scheduler, scaler)
        start_epoch, global_step, best = payload["epoch"] + 1, payload["global_step"], payload["best"]

    writer = None
    if env.is_main:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run), purge_step=global_step or None)
        log.info(
            f"{env.world_size} process(es) on {env.device.type}; {len(split['train'])} train / {len(split['val'])} val images; "
            f"global batch {resolved['global_batch']}, lr {resolved['lr']:.3g}, "
            f"pos_weight {'none' if resolved['pos_weight'] is None else format(resolved['pos_weight'], '.2f')}, amp {resolved['amp']}"
        )
    context = _StepContext(
        env, loss_fn, amp_dtype, scaler, config.grad_accum, config.channels_last, config.clip_grad, config.log_every, PhotometricJitter()
    )
    try:
        for epoch in range(start_epoch, config.epochs + 1):
            _seed_epoch(config.seed, epoch, env.rank)
            train_sampler.set_epoch(epoch)
            started = time.perf_counter()
            train_loss, global_step = train_one_epoch(
                model, train_loader, optimizer, scheduler, context, epoch, config.epochs, global_step, writer
            )
            elapsed = time.perf_counter() - started
            images_per_s = steps_per_epoch * resolved["global_batch"] / elapsed
            peak_gb = torch.cuda.max_memory_allocated(env.device) / 2**30 if env.device.type == "cuda" else None
            metrics = None
            distributed.broadcast_buffers(model_without_ddp)
            if epoch % config.val_every == 0 or epoch == config.epochs:
                validation = evaluate(model_without_ddp, val_loader, context, want_samples=env.is_main)
                metrics = validation.metrics() if len(split["val"]) else None
                if metrics:
                    model_without_ddp.threshold = metrics["threshold"]
            improved = metrics is not None and _improves(config.monitor, metrics, best["score"])
            if improved:
                best = {"metric": config.monitor, "score": metrics[config.monitor], "epoch": epoch}
            if env.is_main:
                _save_epoch(run, epoch, global_step, model_without_ddp, optimizer, scheduler, scaler, best, metrics, config, resolved, split, improved)
                _report(writer, epoch, config.epochs, train_loss, images_per_s, peak_gb, metrics, validation if metrics else None, best)
            distributed.barrier()
    finally:
        if writer is not None:
            writer.close()
    if env.is_main and best["score"] is not None:
        log.info(f"best {best['metric']} {best['score']:.4f} at epoch {best['epoch']}; run folder: {run}")
    return {"run": str(run), "best": best, "epochs_run": config.epochs - start_epoch + 1}


@dataclass
class _StepContext:
    env: distributed.Environment
    loss_fn: CrackLoss
    amp_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler
    grad_accum: int
    channels_last: bool
    clip_grad: float | None
    log_every: int
    augment: PhotometricJitter | None = None

    def to_device(self, images: torch.Tensor, augment: bool = False) -> torch.Tensor:
        images = images.to(self.env.device, non_blocking=True)
        if augment and self.augment is not None:
            images = self.augment(images)
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.amp_dtype)


def train_one_epoch(model, loader, optimizer, scheduler, context: _StepContext, epoch: int, epochs: int, global_step: int, writer=None):
    """One pass over ``loader``; returns the exact epoch loss (all processes) and the global step.

    Micro-batches are grouped by ``grad_accum``: the loss of each is divided by the weight
    sum of the whole global batch, computed before any backward pass, and all but the last
    backward run under ``no_sync``. A non-finite loss is recorded on the device (no host
    sync per step) and raises at the next log point, naming its step.
    """
    env, loss_fn = context.env, context.loss_fn
    model.train()
    device = env.device
    loss_total = torch.zeros((), dtype=torch.float64, device=device)
    weight_total = torch.zeros((), dtype=torch.float64, device=device)
    window_loss = torch.zeros((), dtype=torch.float64, device=device)
    window_weight = torch.zeros((), dtype=torch.float64, device=device)
    first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
    steps = len(loader) // context.grad_accum
    bar = tqdm(total=steps, desc=f"epoch {epoch}/{epochs}", disable=None if env.is_main else True, leave=False, dynamic_ncols=True)
    window_start, window_images = time.perf_counter(), 0
    micro_batches = []
    step = 0
    for images, masks in loader:
        micro_batches.append((context.to_device(images, augment=True), masks.to(device, non_blocking=True)))
        if len(micro_batches) < context.grad_accum:
            continue
        step += 1
        global_step += 1
        local_weight = sum(loss_fn.weight_sum(m) for _, m in micro_batches)
        global_weight = distributed.all_reduce_sum(local_weight.clone())
        scale = env.world_size / global_weight  # DDP averages gradients over processes
        step_loss = torch.zeros((), dtype=torch.float64, device=device)
        for index, (batch_images, batch_masks) in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last or not isinstance(model, DistributedDataParallel) else model.no_sync()
            with sync:
                with context.autocast():
                    logits = model(batch_images)
                bce_sum = loss_fn.weighted_bce_sum(logits, batch_masks)
                loss = (bce_sum * scale).float()
                if loss_fn.dice:
                    loss = loss + loss_fn.dice_loss(logits, batch_masks) / context.grad_accum
                context.scaler.scale(loss).backward()
            step_loss += bce_sum.detach()
        first_bad_step = torch.where((first_bad_step < 0) & ~torch.isfinite(step_loss), global_step, first_bad_step)
        if context.clip_grad:
            context.scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), context.clip_grad)
        context.scaler.step(optimizer)
        context.scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_total += step_loss
        weight_total += local_weight
        window_loss += step_loss
        window_weight += local_weight
        window_images += sum(len(i) for i, _ in micro_batches) * env.world_size
        micro_batches.clear()
        bar.update()
        if step % context.log_every == 0 or step == steps:
            _raise_if_diverged(first_bad_step, epoch, global_step - step)
            if env.is_main:
                rate = window_images / (time.perf_counter() - window_start)
                loss_value = (window_loss / window_weight).item()
                bar.set_postfix(loss=f"{loss_value:.4f}", img_s=f"{rate:.1f}")
                if writer is not None:
                    writer.add_scalar("train/loss", loss_value, global_step)
                    writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], global_step)
                    writer.add_scalar("train/images_per_s", rate, global_step)
            window_loss.zero_()
            window_weight.zero_()
            window_start, window_images = time.perf_counter(), 0
    bar.close()
    sums = distributed.all_reduce_sum(torch.stack([loss_total, weight_total]))
    return (sums[0] / sums[1]).item(), global_step


def _raise_if_diverged(first_bad_step: torch.Tensor, epoch: int, epoch_start_step: int) -> None:
    """Every process takes the same decision: the earliest bad step over all of them."""
    marker = torch.where(first_bad_step < 0, torch.iinfo(torch.long).max, first_bad_step)
    earliest = distributed.all_reduce_min(marker.clone()).item()
    if earliest != torch.iinfo(torch.long).max:
        raise RunError(
            f"non-finite loss at epoch {epoch}, step {earliest - epoch_start_step} (global step {earliest}); "
            "training stopped and the checkpoints already written are untouched"
        )


@torch.inference_mode()
def evaluate(model: nn.Module, loader, context: _StepContext, want_samples: bool = False) -> Validation:
    """Validation loss and probability histograms summed over this process's shard and then all processes."""
    env, loss_fn = context.env, context.loss_fn
    model.eval()
    histograms = torch.zeros((3, BINS), dtype=torch.long, device=env.device)
    sums = torch.zeros(2, dtype=torch.float64, device=env.device)
    samples = None
    for images, masks, valid in loader:
        masks, valid = masks.to(env.device, non_blocking=True), valid.to(env.device, non_blocking=True)
        with context.autocast():
            logits = model(context.to_device(images))
        sums[0] += loss_fn.weighted_bce_sum(logits, masks, valid)
        sums[1] += loss_fn.weight_sum(masks, valid)
        probs = torch.sigmoid(logits.float())
        histograms += threshold_histograms(probs, masks, valid)
        if want_samples and samples is None:
            samples = _overlay(images[:4], probs[:4].cpu() >= unwrap(model).threshold, masks[:4].cpu())
    distributed.all_reduce_sum(histograms)
    distributed.all_reduce_sum(sums)
    loss = (sums[0] / sums[1]).item() if sums[1] > 0 else float("nan")
    return Validation(loss, histograms.cpu(), samples)


def restore_training_state(payload: dict, optimizer, scheduler, scaler) -> None:
    """Put back what the model weights alone do not hold: optimizer, learning-rate schedule, AMP scaler."""
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if payload.get("scaler"):
        scaler.load_state_dict(payload["scaler"])


def _overlay(images: torch.Tensor, predicted: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Photos with predicted cracks in red, true cracks in green (both: yellow)."""
    out = images.clone()
    predicted, truth = predicted[:, 0], truth[:, 0].bool()
    out[:, 0][predicted] = 255
    out[:, 1][truth] = 255
    out[:, 2][predicted | truth] = 0
    return out


def _check_options(config: TrainConfig, env: distributed.Environment) -> None:
    choices = {
        "optimizer": ("adamw", "sgd"),
        "scheduler": ("cosine", "poly", "step"),
        "amp": ("auto", "bf16", "fp16", "off"),
        "strategy": ("ddp", "dp"),
        "loss": ("bce", "bce+dice"),
        "lr_scaling": ("linear", "sqrt", "none"),
        "monitor": ("f1", "iou", "loss"),
        "on_bad_sample": ("error", "skip"),
    }
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            raise InputError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, got {getattr(config, name)!r}")
    for name in ("epochs", "batch_size", "grad_accum", "val_every", "log_every", "crop_size", "base_batch"):
        if getattr(config, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(config, name)}")
    if config.strategy == "dp" and env.distributed:
        raise InputError("--strategy dp runs as one process driving every GPU; start it with crackseg train, not torchrun")
    if config.sync_bn and env.device.type != "cuda":
        raise InputError("--sync-bn needs CUDA devices (SyncBatchNorm has no CPU implementation)")
    if config.amp == "fp16" and env.device.type == "cpu":
        raise InputError("--amp fp16 needs a GPU; use --amp bf16 or off on CPU")
    if config.data is None and (config.images is None or config.masks is None):
        raise InputError("give --data ROOT, or both --images DIR and --masks DIR")


def _find_resume_source(run: Path, config: TrainConfig) -> Path | None:
    """The checkpoint to continue from: ``last.pt``, else the newest intact epoch file."""
    if config.resume == "none":
        if any(run.glob("*.pt")):
            raise InputError(f"{run} already holds checkpoints; resume it (--resume auto) or choose another --run")
        return None
    if config.resume != "auto":
        path = Path(config.resume)
        read_checkpoint(path)
        return path
    last = run / "last.pt"
    if not last.exists():
        return None
    try:
        read_checkpoint(last)
        return last
    except InputError as error:
        for candidate in sorted(run.glob("epoch_*.pt"), reverse=True):
            try:
                read_checkpoint(candidate)
            except InputError:
                continue
            print(f"crackseg: warning: {error}; resuming from {candidate} instead", file=sys.stderr)
            return candidate
        raise InputError(f"{error}, and no intact epoch_NNNN.pt in {run} to fall back to") from None


def _check_same_run(config: TrainConfig, saved: dict, source: Path) -> None:
    current = dataclasses.asdict(config)
    differ = [key for key in current if key not in RESUMABLE_CHANGES and key in saved and current[key] != saved[key]]
    if differ:
        listing = ", ".join(f"--{key.replace('_', '-')} {current[key]} (saved: {saved[key]})" for key in differ)
        raise InputError(f"{listing} contradicts the run saved in {source}; resume with its settings or start another --run")


def _decided_on_main(env: distributed.Environment, decide, *args):
    """Run ``decide(*args)`` on rank 0 and hand its result, or its InputError, to every rank.

    Raising on rank 0 alone would leave the other ranks waiting in a collective forever.
    """
    outcome = None
    if env.is_main:
        try:
            outcome = ("ok", decide(*args))
        except InputError as error:
            outcome = ("error", str(error))
    outcome = distributed.broadcast_from_main(outcome)
    if outcome[0] == "error":
        raise InputError(outcome[1])
    return outcome[1]


def _scan_and_split(config: TrainConfig, env: distributed.Environment, run: Path, payload: dict | None):
    """Check the dataset, fix the split and the crack weight, and write them into the run folder."""
    found = open_dataset(
        Path(config.data) if config.data else None,
        Path(config.images) if config.images else None,
        Path(config.masks) if config.masks else None,
        config.mask_pattern,
    )
    samples = usable_samples(found, config.on_bad_sample)
    run.mkdir(parents=True, exist_ok=True)
    if found.problems:
        write_atomic(run / "skipped.txt", "".join(f"{problem}\n" for problem in found.problems))
    if payload is not None:
        split = load_split(run / "split.json") if (run / "split.json").is_file() else payload["split"]
        resolved = dict(payload["config"]["resolved"])
    else:
        split = make_split([s.stem for s in samples], config.val_fraction, config.seed, found.listed)
        if not split["train"]:
            raise InputError("no training images left after the split")
        resolved = _resolve(config, env, split, found)
    usable = {s.stem for s in samples}
    lost = sorted(stem for name in ("train", "val") for stem in split[name] if stem not in usable)
    if lost:
        raise InputError(f"{len(lost)} images of the saved split are no longer usable (e.g. {lost[0]}); see the problems with crackseg inspect")
    resolved["workers"] = _workers(config)
    save_split(run / "split.json", split)
    write_atomic(run / "config.json", json.dumps({"options": dataclasses.asdict(config), "resolved": resolved}, indent=1) + "\n")
    return resolved, split, samples


def _resolve(config: TrainConfig, env: distributed.Environment, split: dict, found) -> dict:
    """Values derived once for the run: the crack weight, the learning rate, the precision."""
    if config.pos_weight == "auto":
        pos_weight = crack_pixel_weight([found.masks[stem] for stem in split["train"]], config.pos_weight_scale)
    elif config.pos_weight == "none":
        pos_weight = None
    else:
        try:
            pos_weight = float(config.pos_weight)
        except ValueError:
            raise InputError(f"--pos-weight must be auto, none or a number, got {config.pos_weight!r}") from None
    devices = torch.cuda.device_count() if config.strategy == "dp" and env.device.type == "cuda" else 1
    global_batch = config.batch_size * config.grad_accum * env.world_size * max(devices, 1)
    ratio = global_batch / config.base_batch
    lr = config.lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[config.lr_scaling]
    amp = config.amp
    if amp == "auto":
        amp = "bf16" if env.device.type == "cuda" and torch.cuda.is_bf16_supported() else "off"
    return {
        "pos_weight": pos_weight,
        "global_batch": global_batch,
        "lr": lr,
        "amp": amp,
        "world_size": env.world_size,
        "crackseg": crackseg.__version__,
        "torch": str(torch.__version__),
    }


def _workers(config: TrainConfig) -> int:
    return distributed.spare_cores() if config.workers is None else config.workers


def _subset(samples, stems: list[str]):
    by_stem = {sample.stem: sample for sample in samples}
    return [by_stem[stem] for stem in stems]


def _build_optimizer(config: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]  # biases and norms
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    return torch.optim.AdamW(groups, lr=lr)


def _build_scheduler(config: TrainConfig, optimizer, steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step schedule: linear warm-up, then cosine, poly(0.9) or x0.1 steps at 60% and 85%."""
    total = config.epochs * steps_per_epoch
    warmup = min(int(config.warmup_epochs * steps_per_epoch), total - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if config.scheduler == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if config.scheduler == "poly":
            return (1.0 - progress) ** 0.9
        return 0.1 ** sum(progress >= milestone for milestone in (0.6, 0.85))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _seed_epoch(seed: int, epoch: int, rank: int) -> None:
    """Every epoch starts from RNG states that depend on (seed, epoch, rank) only: resume is exact."""
    value = (seed * 1_000_003 + epoch) * 1_000_003 + rank
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value % 2**32)


def _improves(monitor: str, metrics: dict, best: float | None) -> bool:
    score = metrics[monitor]
    if math.isnan(score):
        return False
    return best is None or (score < best if monitor == "loss" else score > best)


def _save_epoch(run, epoch, global_step, model, optimizer, scheduler, scaler, best, metrics, config, resolved, split, improved) -> None:
    """Write ``epoch_NNNN.pt`` atomically, then point ``last.pt`` (and ``best.pt``) at it."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model": model_payload(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
        "epoch": epoch,
        "global_step": global_step,
        "best": best,
        "metrics": metrics,
        "config": {"options": dataclasses.asdict(config), "resolved": resolved},
        "split": split,
        "rng": {"scheme": "torch, numpy and random seeded per epoch from (seed, epoch, rank)", "seed": config.seed},
    }
    epoch_file = run / f"epoch_{epoch:04d}.pt"
    save_atomic(payload, epoch_file)
    _link_atomic(epoch_file, run / "last.pt")
    if improved:
        _link_atomic(epoch_file, run / "best.pt")
    for old in sorted(run.glob("epoch_*.pt"))[: -config.keep_last or None]:
        old.unlink()


def _link_atomic(source: Path, target: Path) -> None:
    """Make ``target`` hold ``source``'s bytes without rewriting them (a hard link), atomically."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)
    try:
        os.link(source, temp)
    except OSError:  # file systems without hard links
        import shutil

        shutil.copyfile(source, temp)
    os.replace(temp, target)


def _report(writer, epoch, epochs, train_loss, images_per_s, peak_gb, metrics, validation, best) -> None:
    line = f"epoch {epoch}/{epochs}  train loss {train_loss:.4f}  {images_per_s:.1f} img/s"
    writer.add_scalar("train/epoch_loss", train_loss, epoch)
    if peak_gb is not None:
        line += f"  peak GPU memory {peak_gb:.2f} GB"
        writer.add_scalar("train/peak_gpu_memory_gb", peak_gb, epoch)
    if metrics:
        line += (
            f"  val loss {metrics['loss']:.4f}  F1 {metrics['f1']:.4f} @ {metrics['threshold']:.2f}  IoU {metrics['iou']:.4f}"
            f"  P {metrics['precision']:.3f}  R {metrics['recall']:.3f}"
        )
        for name, value in metrics.items():
            writer.add_scalar(f"val/{name}", value, epoch)
        counts = counts_by_threshold(validation.histograms)
        tp, fp, tn = (t[1:BINS].double() for t in (counts.correct, counts.false_positive, counts.true_negative))
        fn = (counts.truth - counts.found)[1:BINS].double()
        writer.add_pr_curve_raw(
            "val/pr_curve", tp, fp, tn, fn, tp / (tp + fp).clamp(min=1), tp / (tp + fn).clamp(min=1), epoch, num_thresholds=BINS - 1
        )
        if validation.samples is not None:
            writer.add_images("val/samples (red: predicted, green: true)", validation.samples, epoch, dataformats="NCHW")
    if best["score"] is not None:
        line += f"  [best {best['metric']} {best['score']:.4f} @ epoch {best['epoch']}]"
    writer.flush()
    log.info(line)


@contextlib.contextmanager
def _logging_to(run: Path | None):
    """Rank 0 logs to stdout and ``run/train.log``; other ranks log warnings only."""
    handlers = []
    if run is not None:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        file = logging.FileHandler(run / "train.log")
        file.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        handlers = [console, file]
    log.setLevel(logging.INFO if run is not None else logging.WARNING)
    log.propagate = False
    for handler in handlers:
        log.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()
