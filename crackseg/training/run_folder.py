"""The run folder, owned by rank 0: resume source, config and split, epoch files, best/last, reports.

Layout (``--run``)::

    lock               pid, host and torchrun job of the training that uses the folder
    config.json        options and the values resolved from them
    split.json         train / val / test stems
    skipped.txt        problems skipped under --on-bad-sample skip
    epoch_NNNN.pt      the last --keep-last epochs (full training state: :func:`training_state`)
    last.pt, best.pt   hard links to an epoch file
    events.out.tfevents.*, train.log

Only rank 0 writes; on the other ranks the writing methods do nothing and the log shows
warnings only, so the training loop calls them without asking who it is.

The lock (:class:`crackseg.core.locks.FolderLock`) keeps two trainings out of one folder.
"""

from __future__ import annotations

import contextlib

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from crackseg.core.errors import InputError, RunError
from crackseg.core.files import ensure_writable_folder, link_atomic, remove_orphan_temps, write_atomic
from crackseg.core.locks import FolderLock
from crackseg.data.splits import load_split, save_split
from crackseg.evaluation.metrics import counts_by_threshold, threshold_index
from crackseg.model import distributed
from crackseg.model.checkpoint import read_checkpoint, save_model
from crackseg.training.engine import Validation

log = logging.getLogger("crackseg.train")


@dataclass
class TrainingPass:
    """How an epoch's training pass went, as the log and TensorBoard report it."""

    loss: float  # exact, over every process
    images_per_s: float  # over every process
    peak_gb: float | None  # this process's peak GPU memory; None off CUDA


class RunFolder:
    def __init__(self, path: Path, is_main: bool = True):
        self.path = Path(path)
        self.is_main = is_main
        self._writer = None
        self._handlers: list[logging.Handler] = []
        self._lock = FolderLock(self.path, "training", "--run")
        self._created = False

    def acquire(self) -> None:
        """Take the folder's lock (creating the folder), or stop naming the training that holds it.

        Also removes temp files that a killed save left behind: with the lock held, nobody else writes here.
        """
        if not self.is_main:
            return
        self._created = not self.path.exists()
        other = next((kind for name, kind in _NOT_RUNS if (self.path / name).exists()), None)
        if other:  # its checkpoints, config.json and split.json would land among another command's files
            raise InputError(f"--run {self.path}: {other}; give the run a folder of its own")
        ensure_writable_folder(self.path, "--run")
        self._lock.acquire()
        remove_orphan_temps(self.path)

    def release(self) -> None:
        """Remove the lock if this process holds it, and the folder if this run created it and wrote nothing there
        (a mistake in the data found before the first write leaves no empty run folder behind)."""
        self._lock.release()
        if self._created:
            with contextlib.suppress(OSError):  # not empty: the run's files stay
                self.path.rmdir()

    def find_resume_source(self, resume: str) -> tuple[Path, dict] | None:
        """The checkpoint to continue from and its payload: ``last.pt``, else the newest intact epoch file.

        ``resume`` is ``auto``, ``none`` (refused if the folder holds checkpoints) or a path.
        """
        if resume == "none":
            if any(self.path.glob("*.pt")):
                raise InputError(f"{self.path} already holds checkpoints; resume it (--resume auto) or choose another --run")
            return None
        if resume != "auto":
            return Path(resume), _resumable(Path(resume))
        last = self.path / "last.pt"
        if last.exists():
            try:
                return last, _resumable(last)
            except InputError as error:
                problem = str(error)
        elif any(self.path.glob("*.pt")):  # removed by hand: starting afresh would overwrite the epochs left
            problem = f"{last}: missing"
        else:
            return None
        for candidate in sorted(self.path.glob("epoch_*.pt"), reverse=True):
            try:
                payload = _resumable(candidate)
            except InputError:
                continue
            print(f"crackseg: warning: {problem}; resuming from {candidate} instead", file=sys.stderr)
            return candidate, payload
        raise InputError(f"{problem}, and no intact epoch_NNNN.pt in {self.path} to fall back to; resume a checkpoint with "
                         "--resume PATH, or choose another --run")

    def resume_source(self, env: distributed.Environment, resume: str) -> tuple[Path | None, dict | None]:
        """:meth:`find_resume_source` for every process: rank 0 finds the checkpoint and reads it once,
        the other ranks read the file it names. ``(None, None)`` for a fresh run.
        """
        found = None

        def find() -> Path | None:
            nonlocal found
            found = self.find_resume_source(resume)
            return found[0] if found else None

        source = distributed.decided_on_main(env, find)
        if source is None:
            return None, None
        return source, found[1] if found else _resumable(source)

    def saved_split(self) -> dict[str, list[str]] | None:
        path = self.path / "split.json"
        return load_split(path) if path.is_file() else None

    def write_setup(self, options: dict, resolved: dict, split: dict[str, list[str]], skipped: list,
                    datasets: list[dict] = ()) -> None:
        """``config.json`` (the options, the resolved values, each dataset's folder, weight, split counts and checksum),
        ``split.json`` and, when samples were skipped, ``skipped.txt``. A dataset whose checksum changed since the run
        began is said once."""
        if not self.is_main:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self._warn_changed(datasets)
        if skipped:
            write_atomic(self.path / "skipped.txt", "".join(f"{problem}\n" for problem in skipped))
        save_split(self.path / "split.json", split)
        setup = {"options": options, "resolved": resolved} | ({"datasets": list(datasets)} if datasets else {})
        write_atomic(self.path / "config.json", json.dumps(setup, indent=1) + "\n")

    def _warn_changed(self, datasets: list[dict]) -> None:
        try:
            before = {entry["name"]: entry["checksum"] for entry in json.loads((self.path / "config.json").read_text())["datasets"]}
        except (OSError, ValueError, KeyError, TypeError):
            return  # a new run, or one saved before datasets were recorded
        for entry in datasets:
            if before.get(entry["name"], entry["checksum"]) != entry["checksum"]:
                print(f"crackseg: warning: dataset {entry['name']} ({entry['root']}) changed since the run began "
                      "(its photos or masks differ); the run goes on with the saved split", file=sys.stderr)

    def save_epoch(self, model: nn.Module, epoch: int, state: dict, improved: bool, keep_last: int) -> None:
        """Write ``epoch_NNNN.pt`` atomically, point ``last.pt`` (and ``best.pt``) at it, drop old epochs.

        A failed write (a full disk) is a RunError; the files written before stay as they were.
        """
        if not self.is_main:
            return
        epoch_file = self.path / f"epoch_{epoch:04d}.pt"
        try:
            save_model(model, epoch_file, epoch=epoch, **state)
            if improved:  # before last.pt, whose best-so-far would name this epoch while best.pt held an older one
                link_atomic(epoch_file, self.path / "best.pt")
            link_atomic(epoch_file, self.path / "last.pt")
        except OSError as error:
            raise RunError(
                f"cannot write the checkpoint of epoch {epoch} in {self.path} ({error.strerror or error}); "
                "training stopped and the checkpoints already written are intact"
            ) from None
        for old in sorted(self.path.glob("epoch_*.pt"))[:-keep_last]:
            old.unlink()

    def __enter__(self) -> RunFolder:
        """Start logging: rank 0 to stdout and ``train.log``, other ranks warnings only."""
        log.propagate = False
        log.setLevel(logging.INFO if self.is_main else logging.WARNING)
        if self.is_main:
            self.path.mkdir(parents=True, exist_ok=True)
            console = logging.StreamHandler(sys.stdout)
            console.setFormatter(logging.Formatter("%(message)s"))
            file = logging.FileHandler(self.path / "train.log")
            file.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            self._handlers = [console, file]
            for handler in self._handlers:
                log.addHandler(handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for handler in self._handlers:
            log.removeHandler(handler)
            handler.close()
        self._handlers = []

    def open_events(self, global_step: int) -> None:
        """Start the TensorBoard event file; on resume, events after ``global_step`` (the checkpoint's last step, logged
        before it was saved and kept) are dropped: those of the epoch that did not finish."""
        if self.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.path), purge_step=global_step + 1 if global_step else None)

    def log(self, message: str) -> None:
        log.info(message)

    def log_step(self, global_step: int, values: dict[str, float]) -> None:
        """Training progress every ``--log-every`` steps (the ``StepContext.on_log`` of ``train_one_epoch``)."""
        if self._writer is None:
            return
        for name, value in values.items():
            self._writer.add_scalar(f"train/{name}", value, global_step)

    def report_epoch(self, epoch: int, epochs: int, training: TrainingPass, validation: Validation | None, best: dict,
                     by_dataset: dict[str, Validation] | None = None) -> None:
        """One line in the log and the epoch's scalars, PR curve and sample overlays in TensorBoard; with several datasets
        ``validation`` is theirs pooled and ``by_dataset`` each one's, logged and written as val/NAME/..."""
        if not self.is_main:
            return
        writer = self._writer
        line = f"epoch {epoch}/{epochs}  train loss {training.loss:.4f}  {training.images_per_s:.1f} img/s"
        writer.add_scalar("train/epoch_loss", training.loss, epoch)
        if training.peak_gb is not None:
            line += f"  peak GPU memory {training.peak_gb:.2f} GB"
            writer.add_scalar("train/peak_gpu_memory_gb", training.peak_gb, epoch)
        if validation is not None:
            metrics = validation.metrics()
            line += (
                f"  val loss {metrics['loss']:.4f}  F1 {metrics['f1']:.4f} @ {metrics['threshold']:.4g}  IoU {metrics['iou']:.4f}"
                f"  P {metrics['precision']:.3f}  R {metrics['recall']:.3f}"
            )
            for name, value in metrics.items():
                writer.add_scalar(f"val/{name}", value, epoch)
            _add_pr_curve(writer, validation.histograms, epoch)
            if validation.samples is not None:
                images, probs, masks = validation.samples
                overlay = _overlay(images, probs >= metrics["threshold"], masks)
                writer.add_images("val/samples (red: predicted, green: true)", overlay, epoch, dataformats="NCHW")
        if best["score"] is not None:
            line += f"  [best {best['metric']} {best['score']:.4f} @ epoch {best['epoch']}]"
        for name, part in (by_dataset or {}).items():
            figures = part.metrics(validation.metrics()["threshold"])
            line += f"\n    {name}: F1 {figures['f1']:.4f}  IoU {figures['iou']:.4f}  P {figures['precision']:.3f}  R {figures['recall']:.3f}"
            for key, value in figures.items():
                writer.add_scalar(f"val/{name}/{key}", value, epoch)
        writer.flush()
        log.info(line)


def _add_pr_curve(writer, histograms: torch.Tensor, epoch: int) -> None:
    """TensorBoard's PR curve takes thresholds evenly spaced in [0, 1]: the grid points nearest 0.01 .. 0.99."""
    counts = counts_by_threshold(histograms)
    index = torch.tensor([threshold_index(k / 100) for k in range(1, 100)])
    tp, fp, tn = (t[index].double() for t in (counts.correct, counts.false_positive, counts.true_negative))
    fn = (counts.truth - counts.found)[index].double()
    precision, recall = tp / (tp + fp).clamp(min=1), tp / (tp + fn).clamp(min=1)
    writer.add_pr_curve_raw("val/pr_curve", tp, fp, tn, fn, precision, recall, epoch, num_thresholds=len(index))


def _overlay(images: torch.Tensor, predicted: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Photos with predicted cracks in red, true cracks in green (both: yellow)."""
    out = images.clone()
    predicted, truth = predicted[:, 0], truth[:, 0].bool()
    out[:, 0][predicted] = 255
    out[:, 1][truth] = 255
    out[:, 2][predicted | truth] = 0
    return out


def _resumable(path: Path) -> dict:
    """The payload of a run's checkpoint; a model file without the training state a resume needs is refused. A run saved
    by an older crackseg resumes: its weights' own checksum is checked, and the epochs it goes on to save carry the
    current one (as a re-save does)."""
    payload = read_checkpoint(path, resaving=True)
    if "epoch" not in payload:  # save_epoch writes it with the rest of the training state
        raise InputError(f"{path}: a model without its training state (epoch, optimizer, options), not a run's checkpoint: "
                         f"--resume continues a run from its last.pt or an epoch_NNNN.pt; to start from these weights, pass --init {path}")
    return payload


_NOT_RUNS = (("predictions.csv", "a predictions folder (predictions.csv)"), ("images", "a dataset (images/)"))


@dataclass
class RunRecord:
    """What a training checkpoint records of its run besides the model: where the run stands and how it was set up."""

    global_step: int
    best: dict  # {"metric", "score", "epoch"}
    metrics: dict | None  # the epoch's validation figures, None without validation
    options: dict  # TrainConfig, as given
    resolved: dict  # the values derived from it
    split: dict[str, list[str]]
    seed: int


def training_state(optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler, record: RunRecord,
                   averaged: tuple[nn.Module, nn.Module] | None = None) -> dict:
    """What a resume needs besides the model entry: optimizer, learning-rate schedule, AMP scaler, the ``record``; with
    ``averaged`` = (EMA, the model being trained), the trained weights too, since the model entry holds the average."""
    state = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
        "global_step": record.global_step,
        "best": record.best,
        "metrics": record.metrics,
        "config": {"options": record.options, "resolved": record.resolved},
        "split": record.split,
        "rng": {"scheme": "torch, numpy and random seeded per epoch from (seed, epoch, rank)", "seed": record.seed},
    }
    if averaged is not None:
        ema, live = averaged
        state |= {"live_weights": {k: v.detach().cpu() for k, v in live.state_dict().items()}, "ema_updates": int(ema.n_averaged)}
    return state


def restore_training_state(payload: dict, optimizer: torch.optim.Optimizer, scheduler,
                           scaler: torch.amp.GradScaler) -> tuple[int, int, dict]:
    """Put back what :func:`training_state` saved; returns the epoch to start at, the global step and the best score."""
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if payload.get("scaler"):
        scaler.load_state_dict(payload["scaler"])
    return payload["epoch"] + 1, payload["global_step"], payload["best"]
