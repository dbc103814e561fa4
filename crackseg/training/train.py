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
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import DataLoader

from crackseg.core.errors import InputError
from crackseg.data.collection import dataset_of
from crackseg.evaluation.metrics import improves
from crackseg.model import distributed
from crackseg.training.engine import StepContext, Validation, build_optimizer, build_scheduler, train_one_epoch, validate
from crackseg.training.loader import EpochSampler, MixSampler, augments_on_device, negatives_per_epoch, run_loaders
from crackseg.training.losses import CrackLoss
from crackseg.training.options import TrainConfig, check_options, check_same_run, expand_datasets, resolved_encoder
from crackseg.training.run_folder import RunFolder, RunRecord, TrainingPass, restore_training_state, training_state
from crackseg.training.seeding import mix_seed, seed_everything
from crackseg.training.setup import Prepared, build_training_model, check_same_processes, prepare_run
from crackseg.training.transforms import DeviceGeometry, PhotometricJitter


def fit(config: TrainConfig) -> dict:
    """Train as configured, resuming where the run folder says; returns the best score and run folder."""
    config = normalized(config)
    check_options(config)  # with list files read: one may name several datasets
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
    """The encoder the architecture implies, the datasets (list files read) and absolute paths: what the run folder
    records."""
    names = ("images", "masks", "init", "negatives")
    paths = {name: str(Path(value).absolute()) for name in names if (value := getattr(config, name))}
    data, weights = expand_datasets(config)
    return dataclasses.replace(config, encoder=resolved_encoder(config), data=data, data_weights=weights, **paths)


@dataclass
class _Training:
    """What a run trains with, built once: the model (wrapped), its plain self and average, loaders, optimizer, schedule."""

    model: nn.Module
    model_without_ddp: nn.Module
    ema: AveragedModel | None
    sampler: EpochSampler | MixSampler
    train_loader: DataLoader
    val_loaders: dict[str, DataLoader]  # each dataset's validation shard, by name
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    context: StepContext
    steps_per_epoch: int

    @property
    def saved(self) -> nn.Module:
        """What is validated and written as the run's model: the average under --ema."""
        return self.model_without_ddp if self.ema is None else self.ema.module


def _fit(config: TrainConfig, env: distributed.Environment, folder: RunFolder) -> dict:
    source, payload = folder.resume_source(env, config.resume)
    if payload is not None:
        check_same_run(config, payload["config"]["options"], source)
        check_same_processes(payload["config"]["resolved"], env, source)
    prepared = distributed.decided_on_main(env, prepare_run, config, env, folder, payload)
    with folder:
        if source is not None:
            folder.log(f"resuming from {source} (epoch {payload['epoch']} done)")
        if payload is not None and payload["epoch"] >= config.epochs:
            folder.log(f"{folder.path}: all {config.epochs} epochs are done; nothing to train (raise --epochs to continue)")
            return {"run": str(folder.path), "best": payload["best"], "epochs_run": 0}
        training = _build(config, env, folder, prepared, payload)
        best = {"metric": config.monitor, "score": None, "epoch": None}
        start_epoch, global_step = 1, 0
        if payload is not None:
            start_epoch, global_step, best = restore_training_state(payload, training.optimizer, training.scheduler,
                                                                    training.context.scaler)
        folder.open_events(global_step)
        folder.log(_setup_line(config, env, prepared, training))
        for epoch in range(start_epoch, config.epochs + 1):
            global_step, best = _epoch(config, (env, folder, prepared), training, epoch, (global_step, best))
        if best["score"] is not None:
            folder.log(f"best {best['metric']} {best['score']:.4f} at epoch {best['epoch']}; run folder: {folder.path}")
        elif not prepared.split["val"]:
            folder.log(f"no validation photos, so no best.pt and no tuned threshold: predict with {folder.path / 'last.pt'}; "
                       f"run folder: {folder.path}")
        return {"run": str(folder.path), "best": best, "epochs_run": config.epochs - start_epoch + 1}


def _build(config: TrainConfig, env: distributed.Environment, folder: RunFolder, prepared: Prepared,
           payload: dict | None) -> _Training:
    resolved = prepared.resolved
    # --amp auto's CPU recipe is bf16 with NHWC convolutions (docs/results.md); the recorded options stay as given
    layout = config.channels_last or (config.amp == "auto" and resolved.amp == "bf16" and env.device.type == "cpu")
    model, model_without_ddp, ema = build_training_model(dataclasses.replace(config, channels_last=layout), env, payload,
                                                         resolved.init_logit_scale)
    sampler, train_loader, val_loaders = run_loaders(config, env, prepared)
    steps_per_epoch = len(train_loader) // config.grad_accum
    if steps_per_epoch == 0:
        raise InputError(
            f"{len(prepared.split['train'])} training images give no full step of {config.grad_accum} x {config.batch_size} "
            f"images on each of {env.world_size} processes; lower --batch-size or --grad-accum"
        )
    optimizer = build_optimizer(model_without_ddp, config.optimizer, resolved.lr, config.weight_decay)
    scheduler = build_scheduler(optimizer, config.scheduler, config.epochs, steps_per_epoch, config.warmup_epochs)
    amp_dtype = distributed.AMP_DTYPES[resolved.amp]
    context = StepContext(
        env=env, loss_fn=CrackLoss(resolved.pos_weight, dice=config.loss == "bce+dice"), amp_dtype=amp_dtype,
        validation_dtype=distributed.resolve_amp("auto", env.device),
        scaler=torch.amp.GradScaler(env.device.type, enabled=amp_dtype == torch.float16), grad_accum=config.grad_accum,
        channels_last=layout, clip_grad=config.clip_grad, log_every=config.log_every, on_log=folder.log_step,
        epochs=config.epochs, jitter=PhotometricJitter(), ema=ema,
        geometry=DeviceGeometry(config.crop_size) if augments_on_device(config, env) else None,
    )
    return _Training(model, model_without_ddp, ema, sampler, train_loader, val_loaders, optimizer, scheduler, context,
                     steps_per_epoch)


def _setup_line(config: TrainConfig, env: distributed.Environment, prepared: Prepared, training: _Training) -> str:
    resolved, split = prepared.resolved, prepared.split
    pos_weight = "none" if resolved.pos_weight is None else format(resolved.pos_weight, ".2f")
    share = resolved.negative_share
    crack_free = (f"; {negatives_per_epoch(len(split['train']), share)} of {len(prepared.negatives)} crack-free images "
                  f"in each epoch (negative share {share:g})" if prepared.negatives else "")
    datasets = (f"; {len(prepared.weights)} datasets: " + ", ".join(
        f"{name} ({sum(dataset_of(stem) == name for stem in split['train'])} train, weight {weight:g})"
        for name, weight in prepared.weights.items())) if len(prepared.weights) > 1 else ""
    return (
        f"{env.world_size} process(es) on {env.device.type}; {len(split['train'])} train / {len(split['val'])} val images"
        f"{datasets}{crack_free}; "
        f"global batch {resolved.global_batch}, lr {resolved.lr:.3g}, pos_weight {pos_weight}, amp {resolved.amp}"
        + (", channels_last" if training.context.channels_last else "")
        + (f", weights averaged (EMA {config.ema:g})" if training.ema is not None else "")
        + (f", --init logits saturated: scaled by {resolved.init_logit_scale:.3g}" if resolved.init_logit_scale != 1 else "")
        + ((", BatchNorm synchronized" if env.distributed else ", --sync-bn unused: one process's BatchNorm already sees its whole batch")
           if config.sync_bn else "")
    )


def _epoch(config: TrainConfig, run: tuple[distributed.Environment, RunFolder, Prepared], training: _Training, epoch: int,
           progress: tuple[int, dict]) -> tuple[int, dict]:
    """One epoch trained, validated and saved; ``progress`` is (global step, best) before it, and is returned after."""
    env, folder, prepared = run
    global_step, best = progress
    seed_everything(mix_seed(config.seed, epoch, env.rank))  # resume draws what an uninterrupted run would
    training.sampler.set_epoch(epoch)
    started = time.perf_counter()
    train_loss, global_step = train_one_epoch(training.model, training.train_loader, training.optimizer, training.scheduler,
                                              training.context, epoch=epoch, global_step=global_step)
    images_per_s = training.steps_per_epoch * prepared.resolved.global_batch / (time.perf_counter() - started)
    peak_gb = torch.cuda.max_memory_allocated(env.device) / 2**30 if env.device.type == "cuda" else None

    validation, by_dataset = None, {}
    distributed.broadcast_buffers(training.model_without_ddp)
    if training.ema is not None:  # each rank averaged its own BatchNorm statistics
        distributed.broadcast_buffers(training.ema.module)
    if prepared.split["val"] and (epoch % config.val_every == 0 or epoch == config.epochs):
        by_dataset = {name: validate(training.saved, loader, training.context, want_samples=env.is_main and not index,
                                     batch_size=config.val_batch_size or config.batch_size)
                      for index, (name, loader) in enumerate(training.val_loaders.items())}
        validation = Validation.pooled(list(by_dataset.values()))  # the threshold is the pooled sets'
        training.saved.threshold = validation.metrics()["threshold"]
    metrics = validation.metrics() if validation else None
    improved = metrics is not None and improves(config.monitor, metrics[config.monitor], best["score"])
    if improved:
        best = {"metric": config.monitor, "score": metrics[config.monitor], "epoch": epoch}
    record = RunRecord(global_step, best, metrics, config.to_dict(), dataclasses.asdict(prepared.resolved), prepared.split,
                       config.seed)
    averaged = None if training.ema is None else (training.ema, training.model_without_ddp)
    state = training_state(training.optimizer, training.scheduler, training.context.scaler, record, averaged)
    # Every rank waits for rank 0's save, and stops with it if the save fails.
    distributed.decided_on_main(env, folder.save_epoch, training.saved, epoch, state, improved, config.keep_last)
    folder.report_epoch(epoch, config.epochs, TrainingPass(train_loss, images_per_s, peak_gb), validation, best,
                        by_dataset if len(prepared.weights) > 1 else None)
    return global_step, best
