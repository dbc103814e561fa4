"""The step math: ``train_one_epoch`` and ``validate``, plus the optimizer and schedule they drive.

Nothing here knows about paths, files or TensorBoard: progress goes to the
``StepContext.on_log`` callback, and the run folder (:mod:`crackseg.training.run_folder`) decides what to keep.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from tqdm import tqdm

from crackseg.core.errors import Diverged
from crackseg.evaluation.metrics import BINS, best_f1, scores_at, threshold_histograms
from crackseg.model import distributed
from crackseg.model.inference import Predictor
from crackseg.model.options import InferenceOptions
from crackseg.training.losses import CrackLoss
from crackseg.training.transforms import DeviceGeometry, PhotometricJitter

LogCallback = Callable[[int, dict[str, float]], None]


@dataclass(kw_only=True)
class StepContext:
    """What every training and validation step needs besides the model and the data: fixed for a run."""

    env: distributed.Environment
    loss_fn: CrackLoss
    amp_dtype: torch.dtype | None = None
    validation_dtype: torch.dtype | None = None  # predict's at --amp auto on this device, so validation scores as it does
    scaler: torch.amp.GradScaler | None = None  # None: no loss scaling (anything but fp16)
    grad_accum: int = 1
    channels_last: bool = False
    clip_grad: float | None = None
    log_every: int = 10
    on_log: LogCallback | None = None  # rank 0 reports training progress here every log_every steps
    epochs: int = 1  # the run's length, for the progress bar
    geometry: DeviceGeometry | None = None  # scaled crops, flips and turns of training batches, on the device
    jitter: PhotometricJitter | None = None  # photometric augmentation of training batches, on the device
    ema: AveragedModel | None = None  # moving average of the weights, updated after every optimizer step

    def to_device(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.env.device, non_blocking=True)

    def model_input(self, images: torch.Tensor) -> torch.Tensor:
        """The memory layout the model was converted to."""
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.amp_dtype)


@dataclass
class Validation:
    loss: float
    histograms: torch.Tensor  # (3, BINS) int64 (see crackseg.evaluation.metrics), summed over every process
    samples: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (K, 3, H, W) images, (K, 1, H, W) probabilities, masks
    weight: float = 0.0  # the pixel weight the loss is averaged over, so that validations pool exactly

    def metrics(self, threshold: float | None = None) -> dict[str, float]:
        """The figures at the best-F1 threshold, or at ``threshold`` (another set's, e.g. the pooled datasets')."""
        best = best_f1(self.histograms) if threshold is None else scores_at(self.histograms, threshold)
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

    @staticmethod
    def pooled(parts: list[Validation]) -> Validation:
        """Several validation sets as one: histograms and weighted losses summed, never a mean of means; one set is
        itself."""
        if len(parts) == 1:
            return parts[0]
        weight = sum(part.weight for part in parts)
        loss = sum(part.loss * part.weight for part in parts if part.weight) / weight if weight else float("nan")
        samples = next((part.samples for part in parts if part.samples is not None), None)
        return Validation(loss, sum(part.histograms for part in parts), samples, weight)


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    context: StepContext,
    *,
    epoch: int = 1,
    global_step: int = 0,
) -> tuple[float, int]:
    """One pass over ``loader``; returns the exact epoch loss (all processes) and the global step.

    Micro-batches are grouped by ``grad_accum`` into one optimizer step (:func:`_optimizer_step`); the last
    ``len(loader) % grad_accum`` make no whole step and are not drawn. A non-finite loss is
    recorded on the device (no host sync per step) and raises at the next log point, naming its step. Every
    ``log_every`` steps rank 0 calls ``context.on_log(global_step, {"loss", "lr", "images_per_s"})``.
    ``epoch`` and ``global_step`` are where the run stands when the epoch starts.
    """
    env = context.env
    model.train()
    epoch_sums, window = _LossSums(env.device), _LossSums(env.device)
    first_bad_step = torch.full((), -1, dtype=torch.long, device=env.device)
    steps = len(loader) // context.grad_accum
    bar = tqdm(total=steps, desc=f"epoch {epoch}/{context.epochs}", disable=None if env.is_main else True, leave=False, dynamic_ncols=True)
    micro_batches = []
    step = 0
    for images, masks in itertools.islice(loader, steps * context.grad_accum):  # a partial step's micro-batches: not loaded
        images, masks = context.to_device(images), masks.to(env.device, non_blocking=True)
        if context.geometry is not None:
            images, masks = context.geometry(images, masks)
        if context.jitter is not None:
            images = context.jitter(images)
        micro_batches.append((context.model_input(images), masks))
        if len(micro_batches) < context.grad_accum:
            continue
        step += 1
        global_step += 1
        step_loss, weight = _optimizer_step(model, micro_batches, optimizer, scheduler, context)
        first_bad_step = torch.where((first_bad_step < 0) & ~torch.isfinite(step_loss), global_step, first_bad_step)
        epoch_sums.add(step_loss, weight)
        window.add(step_loss, weight, sum(len(i) for i, _ in micro_batches) * env.world_size)
        micro_batches.clear()
        bar.update()
        if step % context.log_every == 0 or step == steps:
            raise_if_diverged(first_bad_step, epoch, global_step - step)
            window_sums = distributed.all_reduce_sum(torch.stack([window.loss, window.weight]))  # every process's share
            if env.is_main:
                _report((window_sums[0] / window_sums[1]).item(), window, bar, optimizer, context, global_step)
            window.reset()
    bar.close()
    sums = distributed.all_reduce_sum(torch.stack([epoch_sums.loss, epoch_sums.weight]))
    return (sums[0] / sums[1]).item(), global_step


def _optimizer_step(model: nn.Module, micro_batches: list, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, context: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``micro_batches``; returns this process's weighted BCE sum and pixel weight sum.

    The loss of each micro-batch is divided by the weight sum of the whole global batch, computed before any backward
    pass, and all but the last backward run under ``no_sync``.
    """
    env, loss_fn = context.env, context.loss_fn
    scaler = context.scaler or torch.amp.GradScaler(env.device.type, enabled=False)
    local_weight = sum(loss_fn.weight_sum(m) for _, m in micro_batches)
    global_weight = distributed.all_reduce_sum(local_weight.clone())
    scale = env.world_size / global_weight  # DDP averages gradients over processes
    step_loss = torch.zeros((), dtype=torch.float64, device=env.device)
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
            scaler.scale(loss).backward()
        step_loss += bce_sum.detach()
    if context.clip_grad:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), context.clip_grad)
    scaler.step(optimizer)
    scaler.update()
    if context.ema is not None:
        context.ema.update_parameters(model.module if isinstance(model, (DistributedDataParallel, nn.DataParallel)) else model)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, local_weight


class _LossSums:
    """Weighted loss and weight summed on the device (read only at log points), and the images seen since ``reset``."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.weight = torch.zeros((), dtype=torch.float64, device=device)
        self.reset()

    def add(self, loss: torch.Tensor, weight: torch.Tensor, images: int = 0) -> None:
        self.loss += loss
        self.weight += weight
        self.images += images

    def reset(self) -> None:
        self.loss.zero_()
        self.weight.zero_()
        self.started, self.images = time.perf_counter(), 0


def _report(loss_value: float, window: _LossSums, bar: tqdm, optimizer: torch.optim.Optimizer, context: StepContext,
            global_step: int) -> None:
    """``loss_value``: the window's loss over all processes."""
    rate = window.images / (time.perf_counter() - window.started)
    bar.set_postfix(loss=f"{loss_value:.4f}", img_s=f"{rate:.1f}")
    if context.on_log is not None:
        context.on_log(global_step, {"loss": loss_value, "lr": optimizer.param_groups[0]["lr"], "images_per_s": rate})


def raise_if_diverged(first_bad_step: torch.Tensor, epoch: int, epoch_start_step: int) -> None:
    """Every process takes the same decision: the earliest non-finite step over all of them."""
    marker = torch.where(first_bad_step < 0, torch.iinfo(torch.long).max, first_bad_step)
    earliest = distributed.all_reduce_min(marker.clone()).item()
    if earliest != torch.iinfo(torch.long).max:
        raise Diverged(
            f"non-finite loss at epoch {epoch}, step {earliest - epoch_start_step} (global step {earliest}); "
            "training stopped and the checkpoints already written are untouched"
        )


@torch.inference_mode()
def validate(
    model: nn.Module, loader: Iterable, context: StepContext, want_samples: bool = False, batch_size: int | None = None
) -> Validation:
    """Validation loss and probability histograms of this process's images, summed over all processes.

    ``loader`` yields one (image (3, H, W) uint8, mask (1, H, W)) at a time. Each image runs
    exactly as ``predict`` and ``evaluate --checkpoint`` run it (whole up to the tile size,
    blended tiles beyond; tiles batched only with tiles of their own shape), so the scores
    equal ``evaluate``'s on the same images and do not depend on ``batch_size`` or on the
    process count. The loss is the pixel-weighted BCE of the resulting probabilities, each
    clamped to [1e-7, 1 - 1e-7]. With ``want_samples``, up to 4 images of the first
    image's size come back with their probabilities and masks.
    """
    env, loss_fn = context.env, context.loss_fn
    model.eval()
    options = InferenceOptions(batch_size=batch_size, channels_last=context.channels_last)
    predictor = Predictor(model, env.device, options, context.validation_dtype)
    histograms = torch.zeros((3, BINS), dtype=torch.long)
    sums = torch.zeros(2, dtype=torch.float64)
    masks: dict[int, torch.Tensor] = {}
    images: dict[int, torch.Tensor] = {}
    samples: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def stream():
        for key, (image, mask) in enumerate(loader):
            masks[key] = mask.as_subclass(torch.Tensor)
            if want_samples and len(samples) < 4:
                images[key] = image.as_subclass(torch.Tensor)
            yield key, image.as_subclass(torch.Tensor)

    for key, prob in predictor.probabilities(stream()):
        mask = masks.pop(key)[None]
        prob = prob[None, None]
        histograms += threshold_histograms(prob, mask)
        sums[0] += loss_fn.weighted_bce_sum(torch.logit(prob.double(), eps=1e-7), mask)
        sums[1] += loss_fn.weight_sum(mask)
        image = images.pop(key, None)
        if image is not None and (not samples or samples[0][0].shape == image.shape) and len(samples) < 4:
            samples.append((image, prob[0], mask[0]))
    histograms = distributed.all_reduce_sum(histograms.to(env.device)).cpu()
    sums = distributed.all_reduce_sum(sums.to(env.device)).cpu()
    loss = (sums[0] / sums[1]).item() if sums[1] > 0 else float("nan")
    stacked = tuple(torch.stack(part) for part in zip(*samples)) if samples else None
    return Validation(loss, histograms, stacked, sums[1].item())


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW or SGD (Nesterov, momentum 0.9); no weight decay on biases and norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    return torch.optim.AdamW(groups, lr=lr)


def build_scheduler(
    optimizer: torch.optim.Optimizer, name: str, epochs: int, steps_per_epoch: int, warmup_epochs: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step schedule: linear warm-up, then cosine, poly(0.9) or x0.1 steps at 60% and 85%."""
    total = epochs * steps_per_epoch
    warmup = min(int(warmup_epochs * steps_per_epoch), total - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if name == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if name == "poly":
            return (1.0 - progress) ** 0.9
        return 0.1 ** sum(progress >= milestone for milestone in (0.6, 0.85))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
