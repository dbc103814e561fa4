"""What only shows under torchrun: several nodes, restarts of a gloo job, validation sharded over processes and over
datasets, the image cache that a machine's processes share."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

HOLDING_WORKER = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path

    import torch
    from crackseg.model import distributed

    env = distributed.setup("cpu")
    while True:  # in a collective most of the time, as training is
        distributed.all_reduce_sum(torch.ones(1))
        Path(sys.argv[1]).touch()
        time.sleep(0.01)
    """
)


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
TINY = ["--encoder", "mobilenet_v2", "--encoder-weights", "none", "--crop-size", "64", "--batch-size", "2", "--workers", "0",
        "--val-fraction", "0.25", "--log-every", "1", "--device", "cpu", "--amp", "off"]  # float32 on every CPU


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # torchrun gives each of several local processes one thread; the same everywhere makes runs comparable bit for bit.
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}


def _two_nodes(command: list[str], port: int, restarts: int, log_dir) -> list[subprocess.Popen]:
    """Two torchrun agents, one CPU process each, meeting at a c10d rendezvous on 127.0.0.1: ``command`` is a crackseg
    command run by launch.sh, or a script."""
    nodes = []
    for rank in (0, 1):
        if command[0] == "train":
            launcher = ["bash", str(ROOT / "launch.sh"), "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank),
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", str(restarts)]
        else:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank",
                        str(rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", str(restarts)]
        log = open(log_dir / f"node{rank}.log", "w")
        nodes.append(subprocess.Popen([*launcher, *command], stdout=log, stderr=subprocess.STDOUT, env=_launch_env(),
                                      start_new_session=True))
    return nodes


def _train(data: list, run, epochs: int, *extra) -> list[str]:
    return ["train", *[flag for root in data for flag in ("--data", str(root))], "--run", str(run), "--epochs", str(epochs),
            *TINY, *extra]


def _finish(nodes, timeout: float) -> list[int]:
    import signal

    try:
        return [node.wait(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)


def _weights(path):
    from crackseg.model.checkpoint import read_checkpoint

    return read_checkpoint(path)["model"]["state_dict"]


def _one_box(data: list, run, *extra) -> subprocess.CompletedProcess:
    """2 CPU processes on this machine, 2 epochs."""
    return subprocess.run(["bash", str(ROOT / "launch.sh"), "--nproc", "2", "--max-restarts", "0", *_train(data, run, 2, *extra)],
                          capture_output=True, text=True, env=_launch_env(), timeout=300)


def test_a_user_mistake_under_launch_sh_is_said_once_and_ends_with_status_2(tmp_path):
    """torchrun alone restarts the processes (3 times for train), each says the mistake, and it ends in its traceback."""
    for mistake, said in (([tmp_path / "nosuch"], f"--data {tmp_path / 'nosuch'}: no such dataset folder or list file"),
                          ([tmp_path, "--bogus"], "unrecognized arguments: --bogus (see crackseg --help)")):
        command = _train(mistake[:1], tmp_path / "run", 1, *mistake[1:])
        result = subprocess.run(["bash", str(ROOT / "launch.sh"), "--nproc", "2", *command], capture_output=True, text=True,
                                env=_launch_env(), timeout=120)
        assert (result.returncode, result.stderr) == (2, f"crackseg: error: {said}\n")


@pytest.mark.parametrize("launcher, said", [
    (["--nproc", "two"], "--nproc must be a whole number of at least 1, got 'two'"),
    (["--nproc", "0"], "--nproc must be a whole number of at least 1, got '0'"),
    (["--nnodes", "2x"], "--nnodes must be a whole number of at least 1, got '2x'"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank 2 must be below --nnodes 2"),
    (["--max-restarts", "-1"], "--max-restarts must be a whole number of at least 0, got '-1'"),
])
def test_a_bad_launcher_value_is_one_line_and_status_2(tmp_path, launcher, said):
    result = subprocess.run(["bash", str(ROOT / "launch.sh"), *launcher, "train", "--data", str(tmp_path)], capture_output=True,
                            text=True, env=_launch_env(), timeout=60)
    assert (result.returncode, result.stderr) == (2, f"launch.sh: error: {said}\n")


def test_processes_wait_for_each_other_longer_than_the_backends_default(tmp_path):
    """A process whose share is done waits in a collective for the others (NCCL's default gives up after 10 minutes)."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(
        """
        import sys
        from pathlib import Path

        import torch
        from crackseg.model import distributed

        env = distributed.setup("cpu")
        backend = torch.distributed.group.WORLD._get_backend(env.device)
        Path(sys.argv[1], f"rank{env.rank}").write_text(str(backend.options._timeout.total_seconds()))
        distributed.teardown()
        """
    ))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
                             str(tmp_path)], capture_output=True, text=True, env=_launch_env(), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)] == ["7200.0", "7200.0"]


def test_a_gpu_index_for_several_processes_is_refused_before_any_work(monkeypatch):
    from crackseg.core.errors import InputError
    from crackseg.model.distributed import setup

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match=r"^--device cuda:1: with 2 processes each takes the GPU of its local rank"):
        setup("cuda:1")


def test_inputs_that_fail_under_launch_sh_end_with_status_1_and_their_lines(tmp_path, checkpoint):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "broken.jpg").write_bytes(b"not a photo")
    result = subprocess.run(["bash", str(ROOT / "launch.sh"), "--nproc", "2", "predict", "--checkpoint", str(checkpoint),
                             str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--device", "cpu"], capture_output=True,
                            text=True, env=_launch_env(), timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"crackseg: error: {tmp_path / 'in' / 'broken.jpg'}: not a readable image (empty, or another kind of file)"]


@pytest.mark.slow
def test_a_diverged_run_under_launch_sh_is_said_once_and_not_restarted_into_the_same_divergence(synth_root, tmp_path):
    """Resumed, a run repeats its steps bit for bit: torchrun's restarts would diverge again at the same step."""
    command = _train([synth_root], tmp_path / "run", 2, "--lr", "1e30")
    result = subprocess.run(["bash", str(ROOT / "launch.sh"), "--nproc", "2", *command], capture_output=True, text=True,
                            env=_launch_env(), timeout=300)
    said = [line for line in result.stderr.splitlines() if "non-finite loss" in line]
    assert result.returncode == 1 and len(said) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (tmp_path / "run" / "train.log").read_text().count("2 process(es) on cpu") == 1  # one attempt, no restart


CRASHING_AFTER_A_FAILURE = textwrap.dedent("""
    import os, signal, sys
    from crackseg.cli.launch import exit_status

    def attempt():
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            print("crackseg: error: a failure this attempt says", file=sys.stderr)
            return 1
        os.kill(os.getpid(), signal.SIGKILL)

    sys.exit(exit_status(attempt))
""")


def test_a_crash_after_a_failure_the_processes_said_keeps_torchruns_report(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(CRASHING_AFTER_A_FAILURE)
    result = subprocess.run([sys.executable, "-m", "crackseg.cli.launch", "--standalone", "--nproc-per-node", "1", "--max-restarts",
                             "1", str(script)], capture_output=True, text=True, env=_launch_env(), timeout=120)
    assert result.returncode == 1 and "a failure this attempt says" in result.stderr
    assert "ChildFailedError" in result.stderr and "SIGKILL" in result.stderr


@pytest.fixture(scope="module")
def two_datasets(synth_root, tmp_path_factory) -> list:
    """The 12 synthetic photos and 4 more of another site, without split files: 3 and 1 validation photos."""
    from crackseg.data.synth import write_dataset

    roads = tmp_path_factory.mktemp("roads") / "roads"
    write_dataset(roads, count=4, size=(64, 64), seed=4)
    return [synth_root, roads]


@pytest.fixture(scope="module")
def one_box(two_datasets, tmp_path_factory):
    """The run folder of a plain 2-process run on two datasets, shared read-only."""
    run = tmp_path_factory.mktemp("one-box") / "run"
    result = _one_box(two_datasets, run, "--log-every", "1000")  # one log window per epoch: the weights are the same
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "2 process(es) on cpu" in result.stdout
    return run


@pytest.mark.slow
def test_two_nodes_train_the_weights_of_two_processes_on_one_and_one_process_repeats_their_validation(two_datasets, one_box, tmp_path):
    """2 processes on one box and 1 on each of 2 boxes train the same weights; the 2 processes score each dataset's
    validation photos over 2 shards (3 photos: shards of 2 and 1; 1 photo: 1 and none) and 1 process scoring each
    dataset, pooled, agrees exactly."""
    codes = _finish(_two_nodes(_train(two_datasets, tmp_path / "two", 2), _free_port(), 0, tmp_path), timeout=300)
    assert codes == [0, 0], (tmp_path / "node0.log").read_text()[-3000:]
    _assert_same_weights(one_box / "last.pt", tmp_path / "two" / "last.pt")
    _assert_one_process_validates_alike(two_datasets, one_box / "last.pt")


@pytest.mark.slow
def test_the_logged_training_loss_is_every_process_s_not_rank_0_s(one_box):
    """A log window that spans the epoch logs the epoch's loss, which is summed over both processes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(one_box), size_guidance={"scalars": 0})
    events.Reload()
    per_window, per_epoch = events.Scalars("train/loss"), events.Scalars("train/epoch_loss")
    assert len(per_window) == len(per_epoch) == 2
    for window, epoch in zip(per_window, per_epoch):
        assert window.value == pytest.approx(epoch.value, rel=1e-5)


@pytest.mark.slow
def test_two_processes_share_one_decoded_copy_and_train_as_without_it(two_datasets, one_box, tmp_path):
    """With --cache each of 2 local processes decodes half the samples into one shared file, removed once both (and
    their loader worker) mapped it; the run's weights are those of the plain run, which decodes every image in every step
    in the training process."""
    from crackseg.training import image_cache

    before = set(image_cache.SHARED_MEMORY.glob("crackseg-cache-*"))
    result = _one_box(two_datasets, tmp_path / "cached", "--cache", "--workers", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    log = (tmp_path / "cached" / "train.log").read_text()
    assert "12 images decoded once per machine into shared memory" in log and "for its 2 processes" in log
    assert log.count("--cache:") == 3  # the training images and each dataset's validation images
    assert "1 image decoded" in log
    assert set(image_cache.SHARED_MEMORY.glob("crackseg-cache-*")) == before
    _assert_same_weights(one_box / "last.pt", tmp_path / "cached" / "last.pt")


def _assert_same_weights(first, second) -> None:
    import torch

    one, other = _weights(first), _weights(second)
    assert one.keys() == other.keys() and all(torch.equal(one[key], other[key]) for key in one)


def _assert_one_process_validates_alike(data: list, checkpoint) -> None:
    import torch

    from crackseg.data.collection import dataset_names, dataset_of
    from crackseg.data.datasets import open_dataset
    from crackseg.model import distributed
    from crackseg.model.checkpoint import load_model, read_checkpoint
    from crackseg.training.engine import StepContext, Validation, validate
    from crackseg.training.loader import CrackDataset
    from crackseg.training.losses import CrackLoss

    payload = read_checkpoint(checkpoint)
    assert payload["config"]["resolved"]["world_size"] == 2
    assert not any(k.startswith("module.") for k in payload["model"]["state_dict"])
    model = load_model(checkpoint)
    context = StepContext(env=distributed.Environment(0, 0, 1, torch.device("cpu")),
                          loss_fn=CrackLoss(payload["config"]["resolved"]["pos_weight"]))
    parts, sizes = [], []
    for name, root in zip(dataset_names(data), data):
        by_stem = {sample.stem: sample for sample in open_dataset(root).samples}
        stems = [stem.split("/", 1)[1] for stem in payload["split"]["val"] if dataset_of(stem) == name]
        parts.append(validate(model, CrackDataset([by_stem[stem] for stem in stems]), context))
        sizes.append(len(stems))
    assert sizes == [3, 1]
    single = Validation.pooled(parts).metrics()
    for name, value in payload["metrics"].items():
        assert single[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name


def _kill_rank_0_once(nodes, ready) -> None:
    """SIGKILL the global rank 0 (the process that writes the checkpoints), on whichever node the rendezvous put it, once
    the file ``ready`` exists."""
    import signal
    import time

    deadline = time.time() + 180
    while not ready.exists() and time.time() < deadline and all(n.poll() is None for n in nodes):
        time.sleep(0.05)
    workers = [int(pid) for node in nodes
               for pid in subprocess.run(["pgrep", "-P", str(node.pid)], capture_output=True, text=True).stdout.split()]
    (rank_0,) = [pid for pid in workers if b"\0RANK=0\0" in b"\0" + open(f"/proc/{pid}/environ", "rb").read()]
    os.kill(rank_0, signal.SIGKILL)


FAST_PATHS = ["--batch-size", "1", "--grad-accum", "2", "--amp", "bf16", "--channels-last", "--activation-checkpointing", "--loss",
              "bce", "--pos-weight", "auto", "--optimizer", "sgd", "--scheduler", "poly", "--ema", "0.9"]


@pytest.mark.slow
def test_rank_0_killed_on_one_node_restarts_both_and_the_run_resumes(synth_root, tmp_path):
    """Accumulation (DDP's no_sync), bf16 autocast, NHWC, recomputed activations and the weight average, together under
    gloo, through a restart of both nodes: the resumed run ends at the epoch, optimizer step and weight-average update
    count an unbroken one would, with finite weights."""
    import torch

    from crackseg.model.checkpoint import read_checkpoint

    run = tmp_path / "run"
    nodes = _two_nodes(_train([synth_root], run, 3, *FAST_PATHS), _free_port(), 1, tmp_path)
    _kill_rank_0_once(nodes, run / "epoch_0001.pt")
    assert _finish(nodes, timeout=300) == [0, 0], (tmp_path / "node0.log").read_text()[-3000:] + (tmp_path / "node1.log").read_text()[-3000:]
    payload = read_checkpoint(run / "last.pt")
    assert payload["epoch"] == 3 and "resuming from" in (run / "train.log").read_text()
    assert payload["global_step"] == payload["ema_updates"] == 3 * 2  # 9 photos: 4 per process, 2 per step per process
    assert payload["config"]["resolved"]["amp"] == "bf16" and payload["config"]["resolved"]["global_batch"] == 4
    assert all(torch.isfinite(value).all() for value in payload["model"]["state_dict"].values() if value.is_floating_point())


@pytest.mark.slow
def test_without_restarts_a_killed_worker_fails_both_nodes_without_hanging(tmp_path):
    """torchrun's policy with --max-restarts 0, on workers set up as crackseg's and waiting in a collective when their
    peer dies (crackseg train across two nodes meets that death above, where it restarts)."""
    script, ready = tmp_path / "worker.py", tmp_path / "ready"
    script.write_text(HOLDING_WORKER)
    nodes = _two_nodes([str(script), str(ready)], _free_port(), 0, tmp_path)
    _kill_rank_0_once(nodes, ready)
    codes = _finish(nodes, timeout=120)
    assert all(code != 0 for code in codes)
