"""Every CUDA path, each held to the CPU or eager result it must reproduce: ``pytest -m cuda`` on a GPU machine.

Skipped without CUDA (CI has none). ``benchmarks/gpu_check.sh`` runs these with the launch.sh trainings
and the GPU benchmarks in one sitting; docs/benchmarks.md ("Verifying on a GPU") says how. Comparisons
that must agree to 1e-3 run in full float32 (the ``exact_fp32`` fixture turns cuDNN's TF32 off, which
is on by default for convolutions and rounds their inputs to 10 bits of mantissa).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from conftest import isolated
from crackseg.model import distributed
from crackseg.model.checkpoint import load_model, read_checkpoint, save_model
from crackseg.model.options import InferenceOptions
from crackseg.training.options import TrainConfig
from crackseg.data.datasets import open_dataset
from crackseg.training.loader import CrackDataset, EpochSampler, make_loader
from crackseg.training.engine import StepContext, build_optimizer, raise_if_diverged, train_one_epoch, validate
from crackseg.core.errors import InputError, RunError
from crackseg.evaluation.evaluate import evaluate_checkpoint
from crackseg.model.export import export_model
from crackseg.training.losses import CrackLoss
from crackseg.model.networks import build_model, enable_activation_checkpointing
from crackseg.prediction.options import PredictOptions
from crackseg.prediction.predict import predict_folder
from crackseg.model.runtimes import choose_runtime, load_runtime
from crackseg.data.synth import write_dataset
from crackseg.training.setup import build_training_model
from crackseg.training.train import fit
from crackseg.training.transforms import PhotometricJitter, train_transform

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda", 0)
# eager unless a test is about compile (on by default on CUDA): compiling would only slow these tests down
TINY = dict(encoder="mobilenet_v2", encoder_weights="none", crop_size=64, batch_size=2, workers=0, val_fraction=0.25, log_every=1,
            compile=False)
TINY_FLAGS = ["--encoder", "mobilenet_v2", "--encoder-weights", "none", "--crop-size", "64", "--batch-size", "2",
              "--val-fraction", "0.25", "--log-every", "1", "--no-compile"]
multi_gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _config(run: Path, data: Path, **changes) -> TrainConfig:
    return TrainConfig(run=str(run), data=str(data), **{**TINY, "epochs": 2, "device": "cuda", **changes})


def _launch_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHON": sys.executable, **extra}


def _visible_gpus(count: int) -> str:
    """CUDA_VISIBLE_DEVICES naming the first ``count`` GPUs this process sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ",".join(ids[:count])


@pytest.fixture
def exact_fp32():
    """Full float32 on the GPU (no TF32) and deterministic cuDNN algorithms; restored afterwards."""
    names = ("allow_tf32", "deterministic", "benchmark")
    saved = [getattr(torch.backends.cudnn, name) for name in names], torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True, False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    for name, value in zip(names, saved[0]):
        setattr(torch.backends.cudnn, name, value)
    torch.backends.cuda.matmul.allow_tf32 = saved[1]


@pytest.fixture
def nccl_group():
    """A real nccl process group of one process on GPU 0: DDP and every collective go through NCCL.

    A one-process torchrun (launch.sh on one GPU) forms no group (crackseg starts one only for
    WORLD_SIZE > 1) and NCCL refuses two ranks on one GPU, so on one GPU this is how nccl runs.
    """
    torch.cuda.set_device(CUDA)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=CUDA)
    try:
        yield distributed.Environment(0, 0, 1, CUDA)
    finally:
        distributed.teardown()


@pytest.fixture(scope="module")
def cuda_run(synth_root, tmp_path_factory) -> Path:
    """A 2-epoch run trained on the GPU in this process with the default precision: read-only for the tests."""
    run = tmp_path_factory.mktemp("cuda") / "run"
    fit(_config(run, synth_root))
    return run


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Five photos: three of 96 px (whole) and two of 200x300 px (several 128-px tiles with predict_tiles' options)."""
    root = tmp_path_factory.mktemp("photos")
    folder = root / "photos"
    folder.mkdir()
    for prefix, count, size, seed in (("small", 3, (96, 96), 1), ("large", 2, (200, 300), 2)):
        write_dataset(root / prefix, count, size, seed=seed)
        for path in sorted((root / prefix / "images").iterdir()):
            shutil.copy(path, folder / f"{prefix}_{path.name}")
    return folder


def _batches(steps: int, batch: int = 2, size: int = 64, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (images uint8 (B, 3, S, S), masks uint8 (B, 1, S, S)) on the CPU, about 5% crack pixels."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (steps, batch, 3, size, size), dtype=torch.uint8, generator=generator)
    masks = (torch.rand((steps, batch, 1, size, size), generator=generator) < 0.05).to(torch.uint8)
    return list(zip(images, masks))


def _train(model: nn.Module, plain: nn.Module, batches, env: distributed.Environment, **options) -> list[float]:
    """One epoch of the real ``train_one_epoch``; returns every optimizer step's loss. ``plain``: the model inside any wrapper.

    SGD at a small learning rate, so each weight moves in proportion to its gradient: Adam's first
    steps move every weight by about the learning rate whatever its gradient, so rounding in
    gradients near zero would part two runs as much as a real difference.
    """
    optimizer = build_optimizer(plain, "sgd", 1e-3, 1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    losses = []
    context = StepContext(env=env, loss_fn=CrackLoss(10.0, dice=True), log_every=1,
                          on_log=lambda step, values: losses.append(values["loss"]), **options)
    train_one_epoch(model, batches, optimizer, scheduler, context)
    assert len(losses) == len(batches) // context.grad_accum
    return losses


def _parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().double().cpu() for name, p in model.named_parameters()}


def _relative_gap(trained: dict, reference: dict, start: dict) -> float:
    """How far two trainings from one start ended apart, against how far the reference went: ||a - b|| / ||b - start||.

    Rounding alone (another memory layout, compiled kernels) parts tiny-batch trainings by a few
    percent within a few steps, through BatchNorm over a handful of values; a run that did not
    train, or trained other weights, is 1 or more.
    """
    gap = sum(((trained[name] - reference[name]) ** 2).sum() for name in reference)
    moved = sum(((reference[name] - start[name]) ** 2).sum() for name in reference)
    assert moved > 0, "the reference did not train"
    return math.sqrt(gap / moved)


def _all_finite(tensors) -> bool:
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


# Mixed precision


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_steps_are_finite_and_fp16_loss_scaling_steps_the_optimizer(amp):
    """Autocast really computes in the asked dtype, the loss stays close to float32's, and with fp16
    every step is either taken by the optimizer or skipped by the GradScaler halving its scale."""
    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    env = distributed.Environment(0, 0, 1, CUDA)
    torch.manual_seed(0)
    model = build_model("mobilenet_v2").to(CUDA)
    dtype = distributed.resolve_amp(amp, CUDA)
    loss_fn = CrackLoss(10.0, dice=True)
    batches = _batches(8)
    images, masks = batches[0][0].to(CUDA), batches[0][1].to(CUDA)
    model.eval()
    with torch.no_grad():
        reference = loss_fn.weighted_bce_sum(model(images), masks)
        with torch.autocast("cuda", dtype=dtype):
            logits = model(images)
        assert logits.dtype == dtype
        mixed = loss_fn.weighted_bce_sum(logits, masks)
    assert mixed.item() == pytest.approx(reference.item(), rel=2e-2)

    scaler = torch.amp.GradScaler("cuda", enabled=amp == "fp16")
    init_scale = scaler.get_scale() if scaler.is_enabled() else 1.0
    optimizer = build_optimizer(model, "adamw", 1e-3, 1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    context = StepContext(env=env, loss_fn=loss_fn, amp_dtype=dtype, scaler=scaler, clip_grad=1.0, jitter=PhotometricJitter(),
                          log_every=2)
    loss, steps = train_one_epoch(model, batches, optimizer, scheduler, context)
    assert steps == len(batches) and math.isfinite(loss)
    assert _all_finite(model.parameters()) and _all_finite(model.buffers())
    taken = max((int(state["step"]) for state in optimizer.state.values()), default=0)  # AdamW's count of steps it took
    if amp == "fp16":
        scale = scaler.get_scale()
        assert math.isfinite(scale) and 0 < scale <= init_scale
        skipped = round(math.log2(init_scale / scale))  # each skipped step halves the scale (no growth within 2000 steps)
        assert taken + skipped == steps and taken >= 1
    else:
        assert taken == steps


def test_fp16_run_saves_its_loss_scale_resumes_on_the_gpu_and_is_refused_on_the_cpu(synth_root, tmp_path):
    run = tmp_path / "run"
    fit(_config(run, synth_root, epochs=1, amp="fp16", clip_grad=1.0))
    first = read_checkpoint(run / "last.pt")
    assert first["config"]["resolved"]["amp"] == "fp16"
    assert 0 < first["scaler"]["scale"] <= 2.0**16 and "_growth_tracker" in first["scaler"]
    fit(_config(run, synth_root, epochs=2, amp="fp16", clip_grad=1.0))
    last = read_checkpoint(run / "last.pt")
    assert last["epoch"] == 2 and last["global_step"] == 2 * first["global_step"]
    assert 0 < last["scaler"]["scale"] <= first["scaler"]["scale"] * 2 and _all_finite(last["model"]["state_dict"].values())
    assert "resuming from" in (run / "train.log").read_text()
    with pytest.raises(InputError, match="fp16 needs a GPU"):
        fit(_config(run, synth_root, epochs=3, amp="fp16", clip_grad=1.0, device="cpu"))


def test_a_non_finite_loss_on_the_gpu_stops_naming_its_step():
    env = distributed.Environment(0, 0, 1, CUDA)
    torch.manual_seed(0)
    model = build_model("mobilenet_v2").to(CUDA)
    with torch.no_grad():
        next(model.net.segmentation_head.parameters()).fill_(float("nan"))
    with pytest.raises(RunError, match="non-finite loss at epoch 1, step 1 "):
        _train(model, model, _batches(3), env)


# Memory layout, torch.compile, DDP on nccl, SyncBatchNorm


def test_channels_last_training_gives_the_eager_loss_and_weights(exact_fp32):
    env = distributed.Environment(0, 0, 1, CUDA)
    torch.manual_seed(0)
    eager = build_model("resnet18").to(CUDA)
    start = _parameters(eager)
    nhwc = copy.deepcopy(eager).to(memory_format=torch.channels_last)
    assert nhwc.net.encoder.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    batches = _batches(4)
    eager_losses = _train(eager, eager, batches, env)
    nhwc_losses = _train(nhwc, nhwc, batches, env, channels_last=True)
    assert nhwc_losses == pytest.approx(eager_losses, rel=1e-4)
    assert _relative_gap(_parameters(nhwc), _parameters(eager), start) < 0.25


def test_nccl_ddp_with_accumulation_trains_as_the_plain_model_and_collectives_run(nccl_group, exact_fp32, synth_root):
    """DDP over nccl with grad accumulation (no_sync on the first micro-batch), validation's sums, the
    decisions broadcast from rank 0 and the non-finite check's minimum, all through NCCL."""
    env = nccl_group
    torch.manual_seed(0)
    plain = build_model("mobilenet_v2").to(CUDA)
    start = _parameters(plain)
    inner = copy.deepcopy(plain)
    ddp = DistributedDataParallel(inner, device_ids=[CUDA.index])
    batches = _batches(6)
    plain_losses = _train(plain, plain, batches, env, grad_accum=2)
    ddp_losses = _train(ddp, inner, batches, env, grad_accum=2)
    assert ddp_losses == pytest.approx(plain_losses, rel=1e-5)
    assert _relative_gap(_parameters(inner), _parameters(plain), start) < 0.01  # the same kernels: equal but for atomics

    assert distributed.broadcast_from_main({"stop": False, "epoch": 3}) == {"stop": False, "epoch": 3}

    def refuse():
        raise InputError("refused on rank 0")

    with pytest.raises(InputError, match="refused on rank 0"):
        distributed.decided_on_main(env, refuse)
    raise_if_diverged(torch.full((), -1, dtype=torch.long, device=CUDA), 1, 0)
    with pytest.raises(RunError, match="step 3 "):
        raise_if_diverged(torch.full((), 5, dtype=torch.long, device=CUDA), 1, 2)

    distributed.broadcast_buffers(inner)
    val_set = CrackDataset(open_dataset(synth_root).samples[:4])
    on_gpu = validate(inner, val_set, StepContext(env=env, loss_fn=CrackLoss(10.0))).metrics()
    dist.destroy_process_group()  # the CPU reference below sums nothing across processes (nccl has no CPU tensors)
    cpu_env = distributed.Environment(0, 0, 1, torch.device("cpu"))
    on_cpu = validate(copy.deepcopy(inner).cpu(), val_set, StepContext(env=cpu_env, loss_fn=CrackLoss(10.0))).metrics()
    for name, value in on_cpu.items():
        assert on_gpu[name] == pytest.approx(value, abs=1e-3), name


def test_sync_bn_replaces_every_batchnorm_and_trains_as_batchnorm_under_ddp(nccl_group, exact_fp32):
    env = nccl_group
    config = TrainConfig(run="unused", data="unused", encoder="resnet18", encoder_weights="none", sync_bn=True)
    pretend = distributed.Environment(0, 0, 2, CUDA)  # build_training_model converts and wraps only for a distributed run
    model, model_without_ddp, _ = build_training_model(config, pretend, None)
    assert isinstance(model, DistributedDataParallel)
    norms = [m for m in model_without_ddp.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert norms and all(isinstance(m, nn.SyncBatchNorm) for m in norms)
    plain = build_model("resnet18").to(CUDA)
    plain.load_state_dict(model_without_ddp.state_dict())
    start = _parameters(plain)
    batches = _batches(4)
    plain_losses = _train(plain, plain, batches, env)
    synced_losses = _train(model, model_without_ddp, batches, env)
    assert synced_losses == pytest.approx(plain_losses, rel=1e-5)
    assert _relative_gap(_parameters(model_without_ddp), _parameters(plain), start) < 0.01


def test_compiled_channels_last_model_under_ddp_gives_the_eager_loss_and_saves_plain_names(nccl_group, exact_fp32, tmp_path):
    """The order train.py uses (channels_last, compile the inner module, then DDP) against eager float32."""
    env = nccl_group
    config = TrainConfig(run="unused", data="unused", encoder="resnet18", encoder_weights="none", channels_last=True, compile=True)
    model, model_without_ddp, _ = build_training_model(config, distributed.Environment(0, 0, 2, CUDA), None)
    assert isinstance(model, DistributedDataParallel)
    eager = build_model("resnet18").to(CUDA)
    eager.load_state_dict(model_without_ddp.state_dict())
    start = _parameters(eager)
    batches = _batches(4)
    eager_losses = _train(eager, eager, batches, env)
    compiled_losses = _train(model, model_without_ddp, batches, env, channels_last=True)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-3)
    assert _relative_gap(_parameters(model_without_ddp), _parameters(eager), start) < 0.25
    save_model(model_without_ddp, tmp_path / "model.pt")
    saved = read_checkpoint(tmp_path / "model.pt")["model"]["state_dict"]
    assert saved.keys() == eager.state_dict().keys()
    torch._dynamo.reset()


def test_a_cuda_run_compiles_by_default_and_not_with_no_compile():
    env = distributed.Environment(0, 0, 1, CUDA)
    common = dict(run="unused", data="unused", encoder="resnet18", encoder_weights="none")
    compiled, _, _ = build_training_model(TrainConfig(**common), env, None)
    plain, _, _ = build_training_model(TrainConfig(**common, compile=False), env, None)
    assert compiled._compiled_call_impl is not None and plain._compiled_call_impl is None


# Activation checkpointing, pinned memory


def test_activation_checkpointing_gives_the_plain_gradient_with_at_least_40_percent_less_memory(exact_fp32):
    torch.manual_seed(0)
    plain = build_model("resnet34").to(CUDA).train()
    checkpointed = copy.deepcopy(plain)
    enable_activation_checkpointing(checkpointed)
    loss_fn = CrackLoss(10.0, dice=True)

    def step(model: nn.Module, images: torch.Tensor, masks: torch.Tensor) -> int:
        """The memory one forward and backward pass adds (activations, their gradients, the weights' gradients), in bytes."""
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(CUDA)
        before = torch.cuda.memory_allocated(CUDA)
        logits = model(images)
        (loss_fn.weighted_bce_sum(logits, masks) / masks.numel() + loss_fn.dice_loss(logits, masks)).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(CUDA) - before

    images, masks = (t.to(CUDA) for t in _batches(1, batch=2, size=128)[0])
    step(plain, images, masks)
    step(checkpointed, images, masks)
    reference = dict(plain.named_parameters())
    for name, p in checkpointed.named_parameters():
        expected = reference[name].grad
        assert torch.allclose(p.grad, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item() + 1e-12), name

    images, masks = (t.to(CUDA) for t in _batches(1, batch=16, size=256)[0])
    plain_bytes = step(plain, images, masks)
    checkpointed_bytes = step(checkpointed, images, masks)
    assert checkpointed_bytes <= 0.6 * plain_bytes, (plain_bytes / 2**20, checkpointed_bytes / 2**20)


def test_crops_flips_and_turns_on_the_gpu_are_the_cpus(exact_fp32):
    """DeviceGeometry, train's default augmentation on a GPU: the same draws resample alike on both devices."""
    from crackseg.training.transforms import DeviceGeometry, window_side

    side = window_side(64)
    images = torch.randint(0, 256, (16, 3, side, side), dtype=torch.uint8)
    masks = (torch.rand(16, 1, side, side) < 0.1).to(torch.uint8)
    geometry = DeviceGeometry(64)
    torch.manual_seed(0)
    on_cpu = geometry(images, masks)
    torch.manual_seed(0)
    on_gpu = [tensor.cpu() for tensor in geometry(images.to(CUDA), masks.to(CUDA))]
    assert (on_gpu[0].int() - on_cpu[0].int()).abs().max() <= 1
    assert (on_gpu[1] == on_cpu[1]).float().mean() >= 0.999


def test_training_loader_pins_its_batches_and_they_arrive_intact(synth_root):
    dataset = CrackDataset(open_dataset(synth_root).samples, train_transform(64), seed=0)
    sampler = EpochSampler(torch.utils.data.SequentialSampler(dataset))
    loader = make_loader(dataset, 4, sampler, workers=2, pin_memory=True, drop_last=True)
    context = StepContext(env=distributed.Environment(0, 0, 1, CUDA), loss_fn=CrackLoss(None))
    seen = 0
    for epoch in (1, 2):  # persistent workers serve the second epoch
        sampler.set_epoch(epoch)
        for images, masks in loader:
            assert images.is_pinned() and masks.is_pinned()
            on_device = context.to_device(images)
            masks_on_device = masks.to(CUDA, non_blocking=True)
            torch.cuda.synchronize()
            assert on_device.device == CUDA and torch.equal(on_device.cpu(), images.as_subclass(torch.Tensor))
            assert torch.equal(masks_on_device.cpu(), masks.as_subclass(torch.Tensor))
            seen += len(images)
    assert seen == 2 * (len(dataset) // 4) * 4


# Whole trainings: one GPU, resume across devices, DataParallel


def test_training_on_the_gpu_fills_the_run_folder(cuda_run):
    log = (cuda_run / "train.log").read_text()
    assert "1 process(es) on cuda" in log and "peak GPU memory" in log and "epoch 2/2" in log
    payload = read_checkpoint(cuda_run / "last.pt")
    expected_amp = "bf16" if torch.cuda.is_bf16_supported() else "off"
    assert payload["config"]["resolved"]["amp"] == expected_amp and payload["epoch"] == 2
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in payload["model"]["state_dict"])
    assert _all_finite(payload["model"]["state_dict"].values())
    assert all(v.device.type == "cpu" for v in payload["model"]["state_dict"].values())
    assert load_model(cuda_run / "best.pt", CUDA).threshold == read_checkpoint(cuda_run / "best.pt")["metrics"]["threshold"]


def test_launch_sh_trains_on_the_visible_gpu_with_pinned_loader_workers(synth_root, tmp_path):
    run = tmp_path / "run"
    result = subprocess.run(
        ["bash", str(ROOT / "launch.sh"), "--max-restarts", "0", "train", "--data", str(synth_root), "--run", str(run),
         "--epochs", "2", *TINY_FLAGS, "--workers", "2"],
        capture_output=True, text=True, env=_launch_env(CUDA_VISIBLE_DEVICES=_visible_gpus(1)), timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    log = (run / "train.log").read_text()
    assert "1 process(es) on cuda" in log and "peak GPU memory" in log
    payload = read_checkpoint(run / "last.pt")
    assert payload["epoch"] == 2 and payload["config"]["resolved"]["world_size"] == 1
    assert _all_finite(payload["model"]["state_dict"].values())


def test_a_gpu_run_resumes_on_the_cpu_and_back(synth_root, tmp_path):
    run = tmp_path / "run"
    fit(_config(run, synth_root, epochs=1))
    first = read_checkpoint(run / "last.pt")
    fit(_config(run, synth_root, epochs=2, device="cpu"))
    second = read_checkpoint(run / "last.pt")
    fit(_config(run, synth_root, epochs=3))
    third = read_checkpoint(run / "last.pt")
    steps = first["global_step"]
    assert [first["epoch"], second["epoch"], third["epoch"]] == [1, 2, 3]
    assert [second["global_step"], third["global_step"]] == [2 * steps, 3 * steps]
    log = (run / "train.log").read_text()
    assert log.count("resuming from") == 2 and "process(es) on cpu" in log and log.count("process(es) on cuda") == 2
    for before, after in ((first, second), (second, third)):
        weights = before["model"]["state_dict"]
        assert any(not torch.equal(weights[k], after["model"]["state_dict"][k]) for k in weights)
        assert _all_finite(after["model"]["state_dict"].values())
        assert after["optimizer"]["state"] and all(
            torch.isfinite(v).all() for state in after["optimizer"]["state"].values() for v in state.values() if torch.is_tensor(v))
    assert third["metrics"] is not None and math.isfinite(third["metrics"]["loss"])


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="DataParallel takes every visible GPU: run with CUDA_VISIBLE_DEVICES=0")
def test_dataparallel_on_one_gpu_trains_as_one_process(synth_root, tmp_path, exact_fp32):
    single, parallel = tmp_path / "single", tmp_path / "dp"
    options = dict(epochs=1, ema=0.9, amp="off", optimizer="sgd", lr=1e-3)  # see _train for SGD
    fit(_config(single, synth_root, **options))
    fit(_config(parallel, synth_root, **options, strategy="dp"))
    a, b = read_checkpoint(single / "last.pt"), read_checkpoint(parallel / "last.pt")
    assert b["config"]["resolved"]["global_batch"] == a["config"]["resolved"]["global_batch"] == TINY["batch_size"]
    assert not any(k.startswith("module.") for k in b["model"]["state_dict"]) and b["ema_updates"] == a["ema_updates"] > 0
    torch.manual_seed(0)
    start = _parameters(build_model("mobilenet_v2"))  # the seeded start both runs built
    live = {name: b["live_weights"][name].double() for name in start}
    reference = {name: a["live_weights"][name].double() for name in start}
    assert _relative_gap(live, reference, start) < 0.01  # one GPU: DataParallel calls the model itself
    assert b["metrics"]["loss"] == pytest.approx(a["metrics"]["loss"], rel=1e-4)


@multi_gpu
def test_two_gpus_train_over_nccl_with_sync_bn_accumulation_and_bf16(synth_root, tmp_path):
    run = tmp_path / "run"
    result = subprocess.run(
        ["bash", str(ROOT / "launch.sh"), "--nproc", "2", "--max-restarts", "0", "train", "--data", str(synth_root),
         "--run", str(run), "--epochs", "2", *TINY_FLAGS, "--batch-size", "1", "--grad-accum", "2", "--workers", "1",
         "--sync-bn", "--amp", "bf16", "--channels-last"],
        capture_output=True, text=True, env=_launch_env(CUDA_VISIBLE_DEVICES=_visible_gpus(2)), timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "2 process(es) on cuda" in (run / "train.log").read_text()
    payload = read_checkpoint(run / "last.pt")
    assert payload["config"]["resolved"]["world_size"] == 2 and payload["config"]["resolved"]["global_batch"] == 4
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in payload["model"]["state_dict"])
    assert _all_finite(payload["model"]["state_dict"].values())


@multi_gpu
def test_dataparallel_over_two_gpus_counts_the_images_each_step_takes(synth_root, tmp_path):
    """DataParallel splits each loader batch over the GPUs: a step takes --batch-size images in all, which the
    learning rate's scaling and the logged images/s must count."""
    run = tmp_path / "run"
    fit(_config(run, synth_root, epochs=1, strategy="dp", batch_size=4))
    payload = read_checkpoint(run / "last.pt")
    assert payload["config"]["resolved"]["global_batch"] == 4
    assert _all_finite(payload["model"]["state_dict"].values())


@multi_gpu
def test_dataparallel_over_two_gpus_trains_with_activation_checkpointing(synth_root, tmp_path):
    """The replicas on the second GPU must recompute their own stages, not the first GPU's."""
    run = tmp_path / "run"
    fit(_config(run, synth_root, epochs=1, strategy="dp", activation_checkpointing=True, batch_size=4))
    assert _all_finite(read_checkpoint(run / "last.pt")["model"]["state_dict"].values())


# Prediction, evaluation and export on the GPU


def _probabilities(folder: Path) -> dict[str, np.ndarray]:
    """The 16-bit probability maps of a predictions folder, as floats in [0, 1]."""
    return {path.name: np.asarray(Image.open(path), dtype=np.float64) / 65535 for path in sorted((folder / "probs").iterdir())}


@pytest.mark.parametrize("tta, channels_last", [("none", False), ("d4", True)])
def test_predict_on_the_gpu_gives_the_cpu_probabilities(cuda_run, photos, tmp_path, tta, channels_last, exact_fp32):
    """Whole images and blended tiles, batched across images, with the loader's pinned memory on the GPU."""
    found = {}
    for device in ("cpu", "cuda"):
        inference = InferenceOptions(tile=128, overlap=32, batch_size=4, tta=tta, device=device, amp="off",
                                     channels_last=channels_last and device == "cuda")
        options = PredictOptions(out=tmp_path / device, inference=inference, save_prob=16, measure=False,
                                 workers=2 if device == "cuda" else 0, decode="workers")  # one JPEG decoder for both
        assert predict_folder(cuda_run / "best.pt", [str(photos)], options) == 0
        found[device] = _probabilities(tmp_path / device)
    assert found["cpu"].keys() == found["cuda"].keys() and len(found["cpu"]) == 5
    for name, expected in found["cpu"].items():
        assert found["cuda"][name].shape == expected.shape
        assert np.abs(found["cuda"][name] - expected).max() <= 1e-3, name


def test_jpegs_decoded_on_the_gpu_in_a_batch_are_pillows_within_rounding(photos):
    """nvJPEG and Pillow's libjpeg-turbo may round the inverse DCT and chroma upsampling apart: a level or so."""
    from crackseg.data.images import load_image
    from crackseg.prediction.decoding import decode_batch, read_photo

    paths = sorted(photos.rglob("*.jpg"))
    raws = [read_photo(path)[1] for path in paths]
    assert len(paths) == 3 and all(raw is not None for raw in raws)
    for path, image in zip(paths, decode_batch(raws, CUDA)):
        expected = load_image(path).int()
        assert image.device.type == "cuda" and image.shape == expected.shape, path
        difference = (image.cpu().int() - expected).abs()
        assert difference.float().mean() <= 1.0 and difference.max() <= 32, (path, difference.float().mean(), difference.max())


def test_predict_command_on_the_gpu_with_its_defaults_stays_close_to_the_cpu(cuda_run, photos, tmp_path):
    """`crackseg predict` as users run it on a GPU: bf16 autocast where supported, TF32, JPEGs decoded on the GPU, loader
    workers and measuring processes."""
    from crackseg.cli.main import main

    common = ["predict", "--checkpoint", str(cuda_run / "best.pt"), str(photos), "--save-prob", "16", "--no-measure"]
    assert main([*common, "--out", str(tmp_path / "cuda")]) == 0
    assert main([*common, "--out", str(tmp_path / "cpu"), "--device", "cpu", "--workers", "0"]) == 0
    on_gpu, on_cpu = _probabilities(tmp_path / "cuda"), _probabilities(tmp_path / "cpu")
    assert on_gpu.keys() == on_cpu.keys() and len(on_cpu) == 5
    differences = np.concatenate([np.abs(on_gpu[name] - on_cpu[name]).ravel() for name in on_cpu])
    assert differences.mean() <= 0.01 and differences.max() <= 0.1, (differences.mean(), differences.max())
    assert len(list((tmp_path / "cuda" / "masks").iterdir())) == 5
    # without --save-prob the masks are thresholded on the GPU and only they come back: the masks of the run above (two
    # GPU runs may pick other convolution algorithms, so a pixel at the threshold may flip)
    masks_only = [arg for arg in common if arg not in ("--save-prob", "16")]
    assert main([*masks_only, "--out", str(tmp_path / "masks-only")]) == 0
    agreement = [np.mean(np.asarray(Image.open(tmp_path / "masks-only" / "masks" / path.name)) == np.asarray(Image.open(path)))
                 for path in sorted((tmp_path / "cuda" / "masks").iterdir())]
    assert len(agreement) == 5 and min(agreement) >= 0.9999, agreement


def test_evaluate_on_the_gpu_gives_the_cpu_scores(cuda_run, synth_root, exact_fp32):
    reports = {
        device: evaluate_checkpoint(cuda_run / "best.pt", synth_root, split="all", tolerance=2,
                                    inference=InferenceOptions(device=device, amp="off", tta="flip"))
        for device in ("cpu", "cuda")
    }
    cpu, gpu = reports["cpu"], reports["cuda"]
    assert gpu["images"] == cpu["images"] == 12 and gpu["threshold"] == cpu["threshold"]
    for name, value in cpu["dataset"].items():
        assert gpu["dataset"][name] == pytest.approx(value, abs=1e-3), name
    for key in ("ap",):
        assert gpu[key] == pytest.approx(cpu[key], abs=1e-3)
    assert gpu["ods"]["f1"] == pytest.approx(cpu["ods"]["f1"], abs=1e-3)
    assert gpu["ois"]["f1"] == pytest.approx(cpu["ois"]["f1"], abs=1e-3)


def test_a_gpu_trained_model_exports_and_its_exports_agree(cuda_run, photos, tmp_path, exact_fp32):
    best = cuda_run / "best.pt"
    folder = export_model(best, "safetensors", tmp_path / "model")
    images = torch.stack([torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1)
                          for p in sorted(photos.glob("small_*"))]).to(CUDA)
    outputs = []
    for path in (best, folder):
        runtime = load_runtime(choose_runtime(path, InferenceOptions(device="cuda", amp="off")))
        assert runtime.device.type == "cuda" and runtime.backend == "torch"
        with torch.inference_mode():
            outputs.append(runtime.model(images))
    assert torch.equal(*outputs)
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    worst = _onnx_export_against_torch(best, tmp_path / "model.onnx", sorted(photos.iterdir()))
    assert worst <= 1e-3, worst


@isolated
def _onnx_export_against_torch(checkpoint: Path, out: Path, files: list[Path]) -> float:
    """The largest probability difference between the ONNX export of ``checkpoint`` (ONNX Runtime) and
    torch on the CPU over ``files``; in another process, as ONNX Runtime must be (see conftest.isolated)."""
    from crackseg.data.images import load_image
    from crackseg.model.inference import Predictor

    export_model(checkpoint, "onnx", out)
    probabilities = []
    for path in (checkpoint, out):
        runtime = load_runtime(choose_runtime(path, InferenceOptions(device="cpu", amp="off")))
        predictor = Predictor(runtime.model, runtime.device, InferenceOptions(tile=128, overlap=32), runtime.amp_dtype)
        probabilities.append(dict(predictor.probabilities((key, load_image(p)) for key, p in enumerate(files))))
    torch_probs, onnx_probs = probabilities
    return max((onnx_probs[key] - torch_probs[key]).abs().max().item() for key in torch_probs)


def test_ray_gpu_actors_two_per_gpu_write_what_a_local_gpu_run_writes(cuda_run, photos, tmp_path):
    """--engine ray with --gpus-per-actor 0.5 on a local Ray: each actor gets the GPU as cuda:0 (float32, TF32 off)."""
    pytest.importorskip("ray.data")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "RAY_ADDRESS")}
    env["NVIDIA_TF32_OVERRIDE"] = "0"
    common = [sys.executable, "-m", "crackseg", "predict", "--checkpoint", str(cuda_run / "best.pt"), str(photos),
              "--save-prob", "16", "--amp", "off", "--tile", "128", "--overlap", "32"]
    local = subprocess.run([*common, "--out", str(tmp_path / "local")], env=env, capture_output=True, text=True, timeout=300)
    ray = subprocess.run([*common, "--out", str(tmp_path / "ray"), "--engine", "ray", "--ray-address", "local",
                          "--gpus-per-actor", "0.5", "--actors", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert local.returncode == ray.returncode == 0, ray.stderr[-3000:]
    on_ray, on_local = _probabilities(tmp_path / "ray"), _probabilities(tmp_path / "local")
    assert on_ray.keys() == on_local.keys() and len(on_local) == 5
    for name, expected in on_local.items():
        assert np.abs(on_ray[name] - expected).max() <= 1e-3, name
    assert sorted(p.name for p in (tmp_path / "ray" / "masks").iterdir()) == sorted(p.name for p in (tmp_path / "local" / "masks").iterdir())
