"""What only shows under torchrun: several nodes, restarts of a gloo job, validation sharded over processes, the image
cache that a machine's processes share."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    from crackseg.model import distributed

    env = distributed.setup("cpu")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    total = distributed.all_reduce_sum(torch.ones(1))
    if attempt == 0 and env.rank == 1:
        os.kill(os.getpid(), 9)  # die after the group formed: torchrun restarts both ranks
    distributed.all_reduce_sum(total)
    print(f"attempt {attempt} rank {env.rank} total {total.item():g}", flush=True)
    distributed.teardown()
    """
)


@pytest.mark.slow
def test_gloo_group_forms_again_after_a_torchrun_restart(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script)],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "attempt 1 rank 0 total 4" in result.stdout and "attempt 1 rank 1 total 4" in result.stdout


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


def _two_nodes(data, run, port: int, restarts: int, epochs: int, log_dir):
    """Two launch.sh invocations, one CPU process each, meeting at a c10d rendezvous on 127.0.0.1."""
    nodes = []
    for rank in (0, 1):
        log = open(log_dir / f"node{rank}.log", "w")
        nodes.append(subprocess.Popen(
            ["bash", str(ROOT / "launch.sh"), "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--max-restarts", str(restarts), "train", "--data", str(data), "--run", str(run),
             "--epochs", str(epochs), *TINY],
            stdout=log, stderr=subprocess.STDOUT, env=_launch_env(), start_new_session=True,
        ))
    return nodes


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


def _one_box(data, run, *extra) -> subprocess.CompletedProcess:
    """2 CPU processes on this machine, 2 epochs."""
    return subprocess.run(["bash", str(ROOT / "launch.sh"), "--nproc", "2", "--max-restarts", "0", "train", "--data", str(data),
                           "--run", str(run), "--epochs", "2", *TINY, *extra], capture_output=True, text=True, env=_launch_env(), timeout=300)


@pytest.fixture(scope="module")
def one_box(synth_root, tmp_path_factory):
    """The run folder of a plain 2-process run, shared read-only."""
    run = tmp_path_factory.mktemp("one-box") / "run"
    result = _one_box(synth_root, run)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "2 process(es) on cpu" in result.stdout
    return run


@pytest.mark.slow
def test_two_nodes_train_the_weights_of_two_processes_on_one_and_one_process_repeats_their_validation(synth_root, one_box, tmp_path):
    """2 processes on one box and 1 on each of 2 boxes train the same weights; the 2 processes score the validation
    images over 2 shards (3 images: shards of 2 and 1, no padding) and 1 process scoring them agrees exactly."""
    codes = _finish(_two_nodes(synth_root, tmp_path / "two", _free_port(), 0, 2, tmp_path), timeout=300)
    assert codes == [0, 0], (tmp_path / "node0.log").read_text()[-3000:]
    _assert_same_weights(one_box / "last.pt", tmp_path / "two" / "last.pt")
    _assert_one_process_validates_alike(synth_root, one_box / "last.pt")


@pytest.mark.slow
def test_two_processes_share_one_decoded_copy_and_train_as_without_it(synth_root, one_box, tmp_path):
    """With --cache each of 2 local processes decodes half the samples into one shared file, removed once both (and
    their loader worker) mapped it; the run's weights are those of the plain run, which decodes every image in every step
    in the training process."""
    from crackseg.training import image_cache

    before = set(image_cache.SHARED_MEMORY.glob("crackseg-cache-*"))
    result = _one_box(synth_root, tmp_path / "cached", "--cache", "--workers", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    log = (tmp_path / "cached" / "train.log").read_text()
    assert "images decoded once per machine into shared memory" in log and "for its 2 processes" in log
    assert log.count("--cache:") == 2  # the training and the validation images
    assert set(image_cache.SHARED_MEMORY.glob("crackseg-cache-*")) == before
    _assert_same_weights(one_box / "last.pt", tmp_path / "cached" / "last.pt")


def _assert_same_weights(first, second) -> None:
    import torch

    one, other = _weights(first), _weights(second)
    assert one.keys() == other.keys() and all(torch.equal(one[key], other[key]) for key in one)


def _assert_one_process_validates_alike(data, checkpoint) -> None:
    import torch

    from crackseg.data.datasets import open_dataset
    from crackseg.model import distributed
    from crackseg.model.checkpoint import load_model, read_checkpoint
    from crackseg.training.engine import StepContext, validate
    from crackseg.training.loader import CrackDataset
    from crackseg.training.losses import CrackLoss

    payload = read_checkpoint(checkpoint)
    assert payload["config"]["resolved"]["world_size"] == 2
    assert len(payload["split"]["val"]) == 3
    assert not any(k.startswith("module.") for k in payload["model"]["state_dict"])
    by_stem = {s.stem: s for s in open_dataset(data).samples}
    val_set = CrackDataset([by_stem[stem] for stem in payload["split"]["val"]])
    context = StepContext(env=distributed.Environment(0, 0, 1, torch.device("cpu")),
                          loss_fn=CrackLoss(payload["config"]["resolved"]["pos_weight"]))
    single = validate(load_model(checkpoint), val_set, context).metrics()
    for name, value in payload["metrics"].items():
        assert single[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name


def _kill_rank_0_after_epoch_1(nodes, run) -> None:
    """SIGKILL the global rank 0, the process that writes the checkpoints, on whichever node the rendezvous put it."""
    import signal
    import time

    deadline = time.time() + 180
    while not (run / "epoch_0001.pt").exists() and time.time() < deadline and all(n.poll() is None for n in nodes):
        time.sleep(0.05)
    workers = [int(pid) for node in nodes
               for pid in subprocess.run(["pgrep", "-P", str(node.pid)], capture_output=True, text=True).stdout.split()]
    (rank_0,) = [pid for pid in workers if b"\0RANK=0\0" in b"\0" + open(f"/proc/{pid}/environ", "rb").read()]
    os.kill(rank_0, signal.SIGKILL)


@pytest.mark.slow
def test_rank_0_killed_on_one_node_restarts_both_and_the_run_resumes(synth_root, tmp_path):
    run = tmp_path / "run"
    nodes = _two_nodes(synth_root, run, _free_port(), 1, 4, tmp_path)
    _kill_rank_0_after_epoch_1(nodes, run)
    assert _finish(nodes, timeout=300) == [0, 0], (tmp_path / "node0.log").read_text()[-3000:] + (tmp_path / "node1.log").read_text()[-3000:]
    from crackseg.model.checkpoint import read_checkpoint

    assert read_checkpoint(run / "last.pt")["epoch"] == 4 and "resuming from" in (run / "train.log").read_text()


@pytest.mark.slow
def test_without_restarts_a_killed_worker_fails_both_nodes_without_hanging(synth_root, tmp_path):
    run = tmp_path / "run"
    nodes = _two_nodes(synth_root, run, _free_port(), 0, 20, tmp_path)
    _kill_rank_0_after_epoch_1(nodes, run)
    codes = _finish(nodes, timeout=120)
    assert all(code != 0 for code in codes)
