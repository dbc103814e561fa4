"""Training on CPU with tiny synthetic data: run folder, exact distributed metrics, resume, faults."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import cli_result

from crackseg.training.options import TrainConfig
from crackseg.core.errors import Diverged, InputError
from crackseg.data.splits import load_split
from crackseg.model import distributed
from crackseg.model.checkpoint import load_model, read_checkpoint
from crackseg.training.run_folder import restore_training_state
from crackseg.model.networks import build_model
from crackseg.training.losses import CrackLoss
from crackseg.training.setup import build_training_model
from crackseg.training.train import fit

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(encoder="mobilenet_v2", encoder_weights="none", crop_size=64, batch_size=2, workers=0, val_fraction=0.25, log_every=1)
TINY_FLAGS = ["--encoder", "mobilenet_v2", "--encoder-weights", "none", "--crop-size", "64", "--batch-size", "2",
              "--workers", "0", "--val-fraction", "0.25", "--log-every", "1", "--device", "cpu"]


def _config(run: Path, data: Path, **changes) -> TrainConfig:
    return TrainConfig(run=str(run), data=str(data), **{**TINY, "epochs": 2, **changes})


def _env_without_torchrun() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHON"] = sys.executable
    return env


def _weights(path: Path) -> dict:
    return read_checkpoint(path)["model"]["state_dict"]


@pytest.fixture(scope="module")
def finished_run(synth_root, tmp_path_factory) -> Path:
    """A 2-epoch single-process run, shared read-only by several tests."""
    run = tmp_path_factory.mktemp("runs") / "done"
    fit(_config(run, synth_root))
    return run


def test_a_run_saved_by_an_older_crackseg_resumes_and_saves_in_the_current_format(finished_run, synth_root, tmp_path):
    import shutil

    from conftest import as_format_1

    run = tmp_path / "older"
    shutil.copytree(finished_run, run)
    for path in run.glob("*.pt"):  # every checkpoint of the run as format 1 wrote it
        payload = torch.load(path, map_location="cpu", weights_only=True)
        as_format_1(payload)
        path.unlink()
        torch.save(payload, path)
    fit(_config(run, synth_root, epochs=3))
    resumed = read_checkpoint(run / "last.pt")
    assert resumed["epoch"] == 3 and resumed["version"] == 2


def test_run_folder_holds_everything(finished_run):
    names = {p.name for p in finished_run.iterdir()}
    assert {"config.json", "split.json", "epoch_0001.pt", "epoch_0002.pt", "last.pt", "best.pt", "train.log"} <= names
    assert any(name.startswith("events.out.tfevents") for name in names)
    payload = read_checkpoint(finished_run / "last.pt")
    for key in ("model", "optimizer", "scheduler", "scaler", "epoch", "global_step", "best", "config", "split", "rng", "version"):
        assert key in payload
    assert payload["epoch"] == 2 and payload["global_step"] == 2 * 4  # 9 train images, batch 2, drop_last
    assert payload["split"] == load_split(finished_run / "split.json")
    assert payload["config"]["resolved"]["pos_weight"] > 1
    assert payload["config"]["resolved"]["input_scaling"] in ("imagenet", "tf")
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in payload["model"]["state_dict"])
    best = read_checkpoint(finished_run / "best.pt")
    assert best["best"]["epoch"] == best["epoch"] and best["best"]["score"] == best["metrics"]["f1"]
    assert best["model"]["config"]["threshold"] == best["metrics"]["threshold"]
    assert load_model(finished_run / "best.pt").threshold == best["metrics"]["threshold"]
    log = (finished_run / "train.log").read_text()
    assert "epoch 2/2" in log and "best f1" in log


def test_default_crack_pixel_weight_is_the_root_of_the_auto_one_and_the_scale_multiplies(finished_run, synth_root, tmp_path):
    default = read_checkpoint(finished_run / "last.pt")["config"]["resolved"]["pos_weight"]
    fit(_config(tmp_path / "auto", synth_root, epochs=1, pos_weight="auto", pos_weight_scale=2.0))
    auto = read_checkpoint(tmp_path / "auto" / "last.pt")["config"]["resolved"]["pos_weight"] / 2.0
    assert auto > 4 and default == pytest.approx(math.sqrt(auto))


def test_tensorboard_events_hold_the_expected_tags(finished_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(finished_run), size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    for tag in ("train/loss", "train/lr", "train/images_per_s", "train/epoch_loss", "val/loss", "val/f1", "val/iou",
                "val/precision", "val/recall", "val/threshold"):
        assert tag in tags["scalars"], tag
    assert len(events.Scalars("train/loss")) == 8 and len(events.Scalars("val/f1")) == 2
    assert "val/pr_curve" in tags["tensors"]
    assert events.Tensors("val/pr_curve")[-1].tensor_proto.tensor_shape.dim[1].size == 99  # thresholds
    assert any(tag.startswith("val/samples") for tag in tags["images"])


def test_checkpoint_restores_lr_and_scheduler(finished_run):
    payload = read_checkpoint(finished_run / "last.pt")
    model = build_model("mobilenet_v2")
    optimizer = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.ndim > 1]},
                                   {"params": [p for p in model.parameters() if p.ndim <= 1]}], lr=1e3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    restore_training_state(payload, optimizer, scheduler, scaler)
    saved_lr = payload["optimizer"]["param_groups"][0]["lr"]
    assert optimizer.param_groups[0]["lr"] == saved_lr != 1e3
    assert scheduler.last_epoch == payload["scheduler"]["last_epoch"] == 8
    assert scheduler.base_lrs == payload["scheduler"]["base_lrs"]


@pytest.mark.slow
def test_resume_after_kill_equals_an_uninterrupted_run(synth_root, tmp_path):
    straight = tmp_path / "straight"
    fit(_config(straight, synth_root, epochs=4))

    broken = tmp_path / "broken"
    process = subprocess.Popen(
        [sys.executable, "-m", "crackseg", "train", "--data", str(synth_root), "--run", str(broken), "--epochs", "4", *TINY_FLAGS],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env_without_torchrun(),
    )
    deadline = time.time() + 120
    while not (broken / "epoch_0002.pt").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert read_checkpoint(broken / "last.pt")["epoch"] in (1, 2, 3)  # the kill may fall between epoch_0002.pt and last.pt

    fit(_config(broken, synth_root, epochs=4))
    resumed, reference = _weights(broken / "last.pt"), _weights(straight / "last.pt")
    assert read_checkpoint(broken / "last.pt")["epoch"] == 4
    assert resumed.keys() == reference.keys()
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key
    assert load_split(broken / "split.json") == load_split(straight / "split.json")


def test_augmentation_on_the_device_trains_reproducibly_and_resumes_exactly(synth_root, tmp_path):
    """--augment-on device (a GPU's default) on the CPU: the workers cut windows, the step scales, flips and turns them;
    the same seed gives the same weights, and a run resumed after its first epoch the weights of one that was not."""
    straight, again, resumed = tmp_path / "straight", tmp_path / "again", tmp_path / "resumed"
    fit(_config(straight, synth_root, augment_on="device"))
    fit(_config(again, synth_root, augment_on="device"))
    shutil.copytree(straight, resumed)
    shutil.copyfile(resumed / "epoch_0001.pt", resumed / "last.pt")  # as a run stopped after its first epoch
    (resumed / "epoch_0002.pt").unlink()
    fit(_config(resumed, synth_root, augment_on="device"))
    reference = _weights(straight / "last.pt")
    for other in (again, resumed):
        weights = _weights(other / "last.pt")
        assert all(torch.equal(weights[key], reference[key]) for key in reference), other.name
    fit(_config(tmp_path / "workers", synth_root, augment_on="workers"))
    workers = _weights(tmp_path / "workers" / "last.pt")
    assert not all(torch.equal(workers[key], reference[key]) for key in reference)  # another augmentation path


def test_weight_average_is_the_saved_model_and_resumes_exactly(synth_root, tmp_path):
    straight = tmp_path / "straight"
    fit(_config(straight, synth_root, epochs=2, ema=0.8))
    last = read_checkpoint(straight / "last.pt")
    assert last["ema_updates"] == last["global_step"] == 2 * 4
    live, averaged = last["live_weights"], last["model"]["state_dict"]
    assert live.keys() == averaged.keys() and not all(torch.equal(live[k], averaged[k]) for k in live)
    assert load_model(straight / "last.pt").threshold == last["metrics"]["threshold"]  # the average was validated

    resumed = tmp_path / "resumed"  # from epoch 1's file, as a restart after a crash would
    fit(_config(resumed, synth_root, epochs=2, ema=0.8, resume=str(straight / "epoch_0001.pt")))
    again = read_checkpoint(resumed / "last.pt")
    assert again["ema_updates"] == last["ema_updates"] and again["metrics"] == last["metrics"]
    for key in averaged:
        assert torch.equal(again["model"]["state_dict"][key], averaged[key]), key
        assert torch.equal(again["live_weights"][key], live[key]), key


def test_truncated_last_checkpoint_falls_back_to_an_intact_epoch(finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    last = run / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    result = fit(_config(run, _data_of(finished_run), epochs=3))
    warning = capsys.readouterr().err
    assert "last.pt" in warning and "epoch_000" in warning and "instead" in warning
    assert result["epochs_run"] >= 1 and read_checkpoint(run / "last.pt")["epoch"] == 3


def _data_of(run: Path) -> str:
    (data,) = read_checkpoint(run / "best.pt")["config"]["options"]["data"]
    return data


def test_non_finite_loss_stops_naming_the_step_and_keeps_checkpoints(synth_root, tmp_path, monkeypatch):
    run = tmp_path / "nan"
    fit(_config(run, synth_root, epochs=1))
    before = {p.name: p.read_bytes() for p in run.glob("*.pt")}
    calls = {"n": 0}
    original = CrackLoss.weighted_bce_sum

    def poisoned(self, logits, masks):
        value = original(self, logits, masks)
        if logits.requires_grad:  # training steps only, not validation
            calls["n"] += 1
            if calls["n"] == 3:
                return value * float("nan")
        return value

    monkeypatch.setattr(CrackLoss, "weighted_bce_sum", poisoned)
    with pytest.raises(Diverged, match=r"non-finite loss at epoch 2, step 3 \(global step 7\)"):
        fit(_config(run, synth_root, epochs=2))
    after = {p.name: p.read_bytes() for p in run.glob("*.pt")}
    assert after == before


def test_dataparallel_strategy_runs(synth_root, tmp_path):
    result = fit(_config(tmp_path / "dp", synth_root, epochs=1, strategy="dp"))
    assert result["epochs_run"] == 1 and (tmp_path / "dp" / "best.pt").exists()


def test_sync_bn_is_refused_where_it_could_not_synchronize():
    """SyncBatchNorm works across DDP processes only: DataParallel would silently keep per-GPU statistics."""
    gpus = distributed.Environment(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    with pytest.raises(InputError, match="--sync-bn synchronizes BatchNorm across torchrun processes; --strategy dp cannot"):
        distributed.check_device_options(gpus, "dp", sync_bn=True, amp="off")
    distributed.check_device_options(gpus, "ddp", sync_bn=True, amp="off")
    cpu = distributed.Environment(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"))
    with pytest.raises(InputError, match="--sync-bn needs CUDA devices"):
        distributed.check_device_options(cpu, "ddp", sync_bn=True, amp="off")


def test_contradicting_a_saved_run_is_an_error(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with pytest.raises(InputError, match=r"--encoder resnet18 \(saved: mobilenet_v2\) contradicts"):
        fit(_config(run, _data_of(finished_run), encoder="resnet18", epochs=3))
    with pytest.raises(InputError, match="already holds checkpoints"):
        fit(_config(run, _data_of(finished_run), resume="none"))
    assert fit(_config(run, _data_of(finished_run), epochs=2))["epochs_run"] == 0


def test_a_validation_split_without_a_crack_is_refused_before_training(synth_root, tmp_path):
    """Every threshold that marks nothing would score F1 1 on it: the run would keep a model that finds no crack."""
    data = shutil.copytree(synth_root, tmp_path / "data")
    stems = sorted(path.stem for path in (data / "images").iterdir())
    empty = torch.zeros(64, 64, dtype=torch.uint8).numpy()
    from PIL import Image

    for stem in stems[:2]:
        Image.fromarray(empty).save(data / "masks" / f"{stem}.png")
    (data / "val.txt").write_text("".join(f"{stem}\n" for stem in stems[:2]))
    (data / "train.txt").write_text("".join(f"{stem}\n" for stem in stems[2:]))
    with pytest.raises(InputError, match=rf"the validation split \(2 photos, e.g. {stems[0]}\) has no crack pixel"):
        fit(_config(tmp_path / "run", data))
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_test_split_that_names_trained_photos_is_refused_on_resume(finished_run, tmp_path):
    run, data = tmp_path / "run", shutil.copytree(_data_of(finished_run), tmp_path / "data")
    fit(_config(run, data, epochs=1))
    trained = load_split(run / "split.json")["train"]
    (data / "test.txt").write_text(f"{trained[1]}\n")
    with pytest.raises(InputError, match=rf"test.txt now lists 1 photo this run trains or validates on \(e.g. {trained[1]};"):
        fit(_config(run, data, epochs=2))
    assert read_checkpoint(run / "last.pt")["epoch"] == 1


def test_a_problem_outside_the_saved_split_does_not_stop_a_resume_and_one_in_it_does(finished_run, tmp_path, capsys):
    """A photo added to the dataset since the run began (not labelled yet) is no part of the run: it is named, not read."""
    run, data = tmp_path / "run", shutil.copytree(_data_of(finished_run), tmp_path / "data")
    fit(_config(run, data, epochs=1))
    trained = load_split(run / "split.json")["train"]
    shutil.copyfile(data / "images" / f"{trained[0]}.jpg", data / "images" / "new.jpg")
    capsys.readouterr()
    fit(_config(run, data, epochs=2))
    assert read_checkpoint(run / "last.pt")["epoch"] == 2
    assert "1 files the resumed run does not train or validate on have problems and are not read (e.g. " in capsys.readouterr().err
    (data / "masks" / f"{trained[0]}.png").unlink()
    with pytest.raises(InputError, match=rf"images of the saved split are no longer usable \(e.g. {trained[0]}\)"):
        fit(_config(run, data, epochs=3))


def test_a_run_resumes_with_the_process_count_it_began_with(finished_run):
    """Its global batch, learning rate and each process's share of an epoch follow from the count."""
    from crackseg.training.setup import check_same_processes

    resolved = read_checkpoint(finished_run / "last.pt")["config"]["resolved"]
    check_same_processes(resolved, distributed.Environment(0, 0, 1, torch.device("cpu")), finished_run / "last.pt")
    with pytest.raises(InputError, match=rf"this run trains with 1 process\(es\) \(global batch 2\), not 2: resume it with 1 "
                                         rf"\(launch.sh --nproc 1\), or start another --run from its weights with --init {finished_run}"):
        check_same_processes(resolved, distributed.Environment(1, 1, 2, torch.device("cpu")), finished_run / "last.pt")


def test_resuming_from_a_model_file_points_to_init(finished_run, tmp_path):
    """A model file (a run's weights re-saved, a shipped model) holds no optimizer or epoch to continue from."""
    from crackseg.model.checkpoint import load_model, save_model

    save_model(load_model(finished_run / "best.pt"), tmp_path / "model.pt")
    with pytest.raises(InputError, match="a model without its training state .*pass --init .*model.pt") as caught:
        fit(_config(tmp_path / "run", _data_of(finished_run), resume=str(tmp_path / "model.pt")))
    assert "\n" not in str(caught.value) and not (tmp_path / "run").exists()


def test_fine_tuning_starts_from_a_converted_classic_checkpoint(synth_root, tmp_path):
    from crackseg.model.classic import convert_classic

    torch.manual_seed(3)
    classic = build_model(arch="unet16").net
    torch.save({"model": classic.state_dict(), "epoch": 9, "valid_loss": 0.2}, tmp_path / "model_best.pt")
    convert_classic(tmp_path / "model_best.pt", "unet16", tmp_path / "unet16.pt")
    with pytest.raises(InputError, match="holds a unet16 model .* pass --arch unet16"):
        fit(_config(tmp_path / "wrong", synth_root, init=str(tmp_path / "unet16.pt")))

    config = _config(tmp_path / "tuned", synth_root, arch="unet16", encoder=None, epochs=1, init=str(tmp_path / "unet16.pt"))
    first, _, _ = build_training_model(config, distributed.Environment(0, 0, 1, torch.device("cpu")), None)
    started_from = {f"net.{k}": v for k, v in classic.state_dict().items()}
    assert all(torch.equal(first.state_dict()[k], started_from[k]) for k in started_from)
    fit(config)
    saved = read_checkpoint(tmp_path / "tuned" / "last.pt")
    assert saved["model"]["config"]["arch"] == "unet16" and saved["config"]["options"]["encoder"] == "vgg16"
    assert saved["config"]["resolved"]["init_logit_scale"] == 1.0  # its logits are far from saturated: left as they are
    assert saved["config"]["resolved"]["input_scaling"].startswith("the --init model's own")  # not --input-scaling's default


def test_skip_policy_trains_on_the_rest_and_lists_the_skipped(synth_root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(synth_root, data)
    (data / "images" / "00003.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(InputError) as caught:
        fit(_config(tmp_path / "strict", data, epochs=1))
    assert "\n" not in str(caught.value)  # one problem, one line
    assert str(caught.value).startswith(f"{data / 'images' / '00003.jpg'}: not a readable image")
    assert str(caught.value).endswith("(fix it, or pass --on-bad-sample skip)")
    assert not (tmp_path / "strict").exists()  # found before anything was written: no empty run folder left
    fit(_config(tmp_path / "lenient", data, epochs=1, on_bad_sample="skip"))
    assert "00003.jpg" in (tmp_path / "lenient" / "skipped.txt").read_text()
    split = load_split(tmp_path / "lenient" / "split.json")
    assert "00003" not in split["train"] + split["val"] and len(split["train"] + split["val"]) == 11


@pytest.mark.slow
def test_a_second_training_of_a_busy_run_stops_at_once_naming_the_first(synth_root, tmp_path):
    """The first run has epochs enough to outlast the second's start on a loaded machine; it goes on, its lock kept,
    until stopped."""
    run = tmp_path / "busy"
    command = [sys.executable, "-m", "crackseg", "train", "--data", str(synth_root), "--run", str(run), "--epochs", "200", *TINY_FLAGS]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env_without_torchrun())
    try:
        deadline = time.time() + 60
        while not (run / "lock").exists() and time.time() < deadline:
            time.sleep(0.02)
        code, error = cli_result(command[3:])
        assert code == 2 and f"in use by pid {first.pid}" in error and error.count("\n") == 1, error
        assert first.poll() is None, first.stderr.read()  # read only once it ended: it cannot block
        assert (run / "lock").exists()
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 143, first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
    assert not (run / "lock").exists()


def test_a_checkpoint_that_cannot_be_written_stops_in_one_line_keeping_the_earlier_ones(finished_run, tmp_path):
    """RLIMIT_FSIZE makes every large write fail the way a full disk does; small files still go through."""
    import resource

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = (run / "last.pt").read_bytes()

    def small_files_only():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    result = subprocess.run(
        [sys.executable, "-m", "crackseg", "train", "--data", _data_of(finished_run), "--run", str(run), "--epochs", "3", *TINY_FLAGS],
        capture_output=True, text=True, env=_env_without_torchrun(), timeout=240, preexec_fn=small_files_only,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("crackseg: error: cannot write the checkpoint of epoch 3")
    assert (run / "last.pt").read_bytes() == before and not list(run.glob(".*crackseg-tmp*"))


def test_ctrl_c_during_a_checkpoint_save_exits_cleanly_and_keeps_the_previous_one(synth_root, tmp_path, monkeypatch, capsys):
    from crackseg.cli.main import main

    run = tmp_path / "interrupted"
    flags = ["train", "--data", str(synth_root), "--run", str(run), "--epochs", "2", *TINY_FLAGS]
    saves = []

    class Interrupted(io.RawIOBase):
        """The file torch.save writes to, Ctrl-C landing at its third write: torch's zip writer then raises its own
        RuntimeError ("unexpected pos") over the KeyboardInterrupt."""

        def __init__(self, file):
            self.file, self.writes = file, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                raise KeyboardInterrupt
            return self.file.write(data)

    original = torch.save

    def interrupted_second_save(payload, file, *args, **kwargs):
        saves.append(payload["epoch"])
        return original(payload, Interrupted(file) if len(saves) == 2 else file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", interrupted_second_save)
    assert main(flags) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "crackseg: interrupted" and "Traceback" not in err
    assert read_checkpoint(run / "last.pt")["epoch"] == 1
    assert not list(run.glob(".*crackseg-tmp*")) and not (run / "lock").exists()


def test_classic_architectures_train_without_an_encoder_flag(synth_root, tmp_path):
    """UNetResNet here; UNet16 in the fine-tuning test above."""
    config = TrainConfig(run=str(tmp_path / "run"), data=str(synth_root), arch="unet_resnet34", epochs=1, encoder_weights="none",
                         crop_size=64, batch_size=2, workers=0, val_fraction=0.25, device="cpu")
    fit(config)
    saved = read_checkpoint(tmp_path / "run" / "last.pt")
    assert saved["model"]["config"]["arch"] == "unet_resnet34" and saved["config"]["options"]["encoder"] == "resnet34"


def test_resume_accepts_the_same_data_folder_spelled_another_way(synth_root, tmp_path, monkeypatch):
    shutil.copytree(synth_root, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    fit(_config(tmp_path / "run", Path("data"), epochs=1))
    assert fit(_config(tmp_path / "run", tmp_path / "data" / ".." / "data", epochs=2))["epochs_run"] == 1


def test_dataparallel_splits_the_loader_batch_so_gpus_do_not_scale_the_learning_rate(monkeypatch):
    from crackseg.training.options import TrainConfig
    from crackseg.model import distributed
    from crackseg.training.setup import _resolve

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    env = distributed.Environment(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    config = TrainConfig(run="r", data="d", strategy="dp", batch_size=8, grad_accum=2, amp="off", pos_weight="none",
                         lr=1e-3, base_batch=16)
    resolved = _resolve(config, env, [])
    assert resolved.global_batch == 16 and resolved.lr == pytest.approx(1e-3)


@pytest.mark.parametrize("native", [True, False])
def test_amp_auto_trains_in_bf16_with_channels_last_on_cpus_that_compute_bf16(synth_root, tmp_path, monkeypatch, native):
    """docs/results.md: on such CPUs the bf16 recipe is as accurate and about twice as fast; elsewhere float32."""
    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: native)
    fit(_config(tmp_path / "run", synth_root, epochs=1))
    assert read_checkpoint(tmp_path / "run" / "last.pt")["config"]["resolved"]["amp"] == ("bf16" if native else "off")
    assert ("amp bf16, channels_last" in (tmp_path / "run" / "train.log").read_text()) == native


def test_native_bf16_is_read_from_the_cpus_flags(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(distributed, "Path", lambda _: cpuinfo)
    for flags, native in (("fpu sse avx2 avx512f avx512bw", False), ("fpu avx512f avx512_bf16", True), ("fp asimd bf16 i8mm", True)):
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert distributed.cpu_has_native_bf16() is native
    cpuinfo.unlink()
    assert distributed.cpu_has_native_bf16() is False
    assert distributed.resolve_amp("auto", torch.device("cpu")) is None  # prediction stays float32 whatever the CPU


def test_the_input_scaling_of_a_run_is_its_models(synth_root, tmp_path):
    config = TrainConfig(run=str(tmp_path / "run"), data=str(synth_root), **{**TINY, "input_scaling": "tf"})
    _, model, _ = build_training_model(config, distributed.Environment(0, 0, 1, torch.device("cpu")), None)
    assert model.config()["mean"] == pytest.approx((127 / 255,) * 3) and model.config()["std"] == pytest.approx((128 / 255,) * 3)
    assert TrainConfig(run="r", data="d").input_scaling == "imagenet"  # what every run before the option used


def test_validation_scores_at_the_precision_evaluate_runs_whatever_precision_trains(synth_root, tmp_path):
    """bf16 training on a CPU, where predict and evaluate run float32: best.pt's F1 and threshold are evaluate's."""
    from crackseg.evaluation.evaluate import evaluate_checkpoint

    result = fit(_config(tmp_path / "run", synth_root, epochs=1, amp="bf16", monitor="f1"))
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    (tmp_path / "val.txt").write_text("\n".join(split["val"]) + "\n")
    report = evaluate_checkpoint(tmp_path / "run" / "best.pt", synth_root, split=str(tmp_path / "val.txt"))
    assert report["dataset"]["f1"] == pytest.approx(result["best"]["score"], abs=1e-9)


def test_a_run_without_validation_says_there_is_no_best_checkpoint(synth_root, tmp_path, capsys):
    fit(_config(tmp_path / "run", synth_root, epochs=1, val_fraction=0.0))
    assert not (tmp_path / "run" / "best.pt").exists() and (tmp_path / "run" / "last.pt").exists()
    assert f"no validation photos, so no best.pt and no tuned threshold: predict with {tmp_path / 'run' / 'last.pt'}" in capsys.readouterr().out
