"""The step math on its own: accumulation, divergence, logging, validation scores, schedules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from crackseg.core.errors import RunError
from crackseg.evaluation.metrics import BINS, bin_of
from crackseg.model import distributed
from crackseg.model.networks import CrackSegModel, build_model
from crackseg.training.engine import (
    StepContext,
    Validation,
    build_optimizer,
    build_scheduler,
    train_one_epoch,
    validate,
)
from crackseg.training.losses import CrackLoss

CPU = distributed.Environment(0, 0, 1, torch.device("cpu"))


def _batches(count: int, size: int = 32, batch: int = 2):
    torch.manual_seed(0)
    images = torch.randint(0, 256, (count * batch, 3, size, size), dtype=torch.uint8)
    masks = torch.zeros(count * batch, 1, size, size, dtype=torch.uint8)
    masks[:, 0, size // 2] = 1
    return [(images[i : i + batch], masks[i : i + batch]) for i in range(0, count * batch, batch)]


def _sgd(model: nn.Module):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def test_gradient_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    masks = torch.zeros(4, 1, 32, 32, dtype=torch.uint8)
    masks[0, 0, 5:9] = 1  # crack pixels only in the first micro-batch: unequal weight sums
    masks[1, 0, :, 3] = 1
    results = []
    for loader, accum in [([(images, masks)], 1), ([(images[:2], masks[:2]), (images[2:], masks[2:])], 2)]:
        torch.manual_seed(1)
        model = build_model(arch="unet16")  # no BatchNorm: batch statistics would differ by construction
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        context = StepContext(env=CPU, loss_fn=CrackLoss(20.0), grad_accum=accum, log_every=1)
        loss, _ = train_one_epoch(model, loader, optimizer, scheduler, context)
        results.append((loss, [p.detach().clone() for p in model.parameters()]))
    (loss_big, big), (loss_accum, accumulated) = results
    assert loss_big == pytest.approx(loss_accum, rel=1e-6)
    changed = [not torch.equal(a, b) for a, b in zip(big, [p for p in build_model(arch="unet16").parameters()])]
    assert any(changed)
    for a, b in zip(big, accumulated):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


class _CountedLoader:
    """A loader that counts the micro-batches drawn from it."""

    def __init__(self, batches: list):
        self.batches, self.drawn = batches, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            self.drawn += 1
            yield batch


def test_micro_batches_that_make_no_whole_step_are_not_drawn():
    torch.manual_seed(0)
    model = build_model(arch="unet16")
    optimizer, scheduler = _sgd(model)
    loader = _CountedLoader(_batches(5))
    context = StepContext(env=CPU, loss_fn=CrackLoss(20.0), grad_accum=2, log_every=1)
    _, global_step = train_one_epoch(model, loader, optimizer, scheduler, context)
    assert (global_step, loader.drawn) == (2, 4)


class _PoisonedAt(nn.Module):
    """A 1x1 convolution whose output turns NaN at its ``bad_call``-th training forward."""

    def __init__(self, bad_call: int):
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 1)
        self.calls, self.bad_call = 0, bad_call

    def forward(self, x):
        self.calls += 1
        out = self.conv(x)
        return out * float("nan") if self.calls == self.bad_call else out


def test_a_non_finite_loss_raises_naming_its_epoch_and_step():
    model = CrackSegModel(_PoisonedAt(bad_call=3), "unet", "pointwise", size_divisor=1)
    optimizer, scheduler = _sgd(model)
    context = StepContext(env=CPU, loss_fn=CrackLoss(5.0), log_every=2, epochs=4)
    with pytest.raises(RunError, match=r"non-finite loss at epoch 4, step 3 \(global step 13\)"):
        train_one_epoch(model, _batches(5), optimizer, scheduler, context, epoch=4, global_step=10)


def test_progress_is_reported_every_log_every_steps_and_at_the_end():
    model = build_model("mobilenet_v2")
    optimizer, scheduler = _sgd(model)
    logged = []
    context = StepContext(env=CPU, loss_fn=CrackLoss(5.0), log_every=2, on_log=lambda s, values: logged.append((s, values)))
    loss, step = train_one_epoch(model, _batches(5), optimizer, scheduler, context, global_step=100)
    assert step == 105 and [s for s, _ in logged] == [102, 104, 105]
    assert all(set(values) == {"loss", "lr", "images_per_s"} and values["loss"] > 0 for _, values in logged)
    assert loss > 0


def test_the_jitter_runs_on_training_batches_only():
    seen = []

    class Recorder:
        def __call__(self, images):
            seen.append(images.dtype)
            return images.float() / 255

    model = build_model("mobilenet_v2")
    optimizer, scheduler = _sgd(model)
    context = StepContext(env=CPU, loss_fn=CrackLoss(5.0), jitter=Recorder())
    train_one_epoch(model, _batches(2), optimizer, scheduler, context)
    assert seen == [torch.uint8, torch.uint8]
    images, masks = _batches(1)[0]
    validate(model, list(zip(images, masks)), context)
    assert len(seen) == 2


def test_validation_helper_reports_best_threshold():
    crack, background = bin_of(torch.tensor([0.8, 0.2]))
    histograms = torch.zeros(3, BINS, dtype=torch.long)
    histograms[0, crack] = histograms[2, crack] = 10  # crack pixels at p = 0.8
    histograms[1, background] = 90  # background at p = 0.2
    metrics = Validation(0.1, histograms).metrics()
    assert metrics["f1"] == 1.0 and 0.2 < metrics["threshold"] <= 0.8


def test_schedule_warms_up_then_decays_to_zero():
    model = nn.Linear(2, 2)
    optimizer = build_optimizer(model, "adamw", lr=1.0, weight_decay=0.1)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]  # no decay on the bias
    scheduler = build_scheduler(optimizer, "cosine", epochs=2, steps_per_epoch=10, warmup_epochs=0.5)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:5] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6])
    assert rates[5] == pytest.approx(1.0) and rates[-1] < 0.02 and scheduler.lr_lambdas[0](20) == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(rates[5:], rates[6:]))
    step = build_scheduler(build_optimizer(model, "sgd", 1.0, 0.0), "step", epochs=10, steps_per_epoch=10, warmup_epochs=0)
    factors = [step.lr_lambdas[0](s) for s in (0, 59, 60, 84, 85, 99)]
    assert factors == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_validation_of_mixed_sizes_does_not_depend_on_batching_and_equals_evaluate(tmp_path):
    """Padding images of different sizes into one batch changed the scores; now each runs as predict runs it."""
    import numpy as np
    from PIL import Image

    from crackseg.model.options import InferenceOptions
    from crackseg.data.datasets import open_dataset
    from crackseg.evaluation.evaluate import evaluate_checkpoint
    from crackseg.model.checkpoint import save_model
    from crackseg.training.loader import CrackDataset

    rng = np.random.default_rng(0)
    for sub in ("images", "masks"):
        (tmp_path / sub).mkdir()
    for index, (height, width) in enumerate([(64, 64), (40, 96), (96, 48), (64, 64), (33, 70)]):
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(tmp_path / "images" / f"{index}.png")
        mask = np.zeros((height, width), np.uint8)
        mask[height // 2, :] = 255
        Image.fromarray(mask).save(tmp_path / "masks" / f"{index}.png")
    torch.manual_seed(0)
    model = build_model("mobilenet_v2").eval()
    dataset = CrackDataset(open_dataset(tmp_path).samples)
    context = StepContext(env=CPU, loss_fn=CrackLoss(5.0))
    one, four = (validate(model, dataset, context, batch_size=size) for size in (1, 4))
    assert torch.equal(one.histograms, four.histograms) and one.loss == pytest.approx(four.loss, rel=1e-9)

    save_model(model, tmp_path / "model.pt")
    report = evaluate_checkpoint(tmp_path / "model.pt", tmp_path, "all", inference=InferenceOptions(device="cpu", batch_size=3))
    metrics = one.metrics()
    assert report["ods"]["f1"] == pytest.approx(metrics["f1"], abs=1e-12)
    assert report["ods"]["threshold"] == pytest.approx(metrics["threshold"])


class _RecordingSchedule(torch.optim.lr_scheduler.LambdaLR):
    """A constant schedule that records the model's parameters at each of its steps (right after the optimizer's)."""

    def __init__(self, optimizer, model: nn.Module):
        self.model, self.seen = model, []
        super().__init__(optimizer, lambda step: 1.0)

    def step(self, *args, **kwargs):
        self.seen.append([p.detach().clone() for p in self.model.parameters()])
        super().step(*args, **kwargs)


def test_the_weight_average_follows_every_optimizer_step_with_its_decay():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    model = CrackSegModel(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 1)), "unet", "tiny", size_divisor=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = _RecordingSchedule(optimizer, model)
    scheduler.seen.clear()  # the schedule's own first step, at its construction
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.6), use_buffers=True)
    context = StepContext(env=CPU, loss_fn=CrackLoss(20.0), log_every=1, ema=ema, grad_accum=2)
    train_one_epoch(model, _batches(6), optimizer, scheduler, context)
    assert len(scheduler.seen) == 3 and int(ema.n_averaged) == 3  # 6 micro-batches, 2 per step
    expected = scheduler.seen[0]
    for weights in scheduler.seen[1:]:
        expected = [0.6 * e + 0.4 * w for e, w in zip(expected, weights)]
    for averaged, want in zip(ema.module.parameters(), expected):
        assert torch.allclose(averaged, want, atol=1e-6, rtol=1e-5)
    assert not all(torch.equal(a, p) for a, p in zip(ema.module.parameters(), model.parameters()))
