"""The run folder on its own: resume source, epoch files and links, setup files, rank 0 alone writes."""

from __future__ import annotations

import json

import pytest

from crackseg.core.errors import InputError
from crackseg.model.checkpoint import read_checkpoint
from crackseg.training.run_folder import RunFolder


def _save_epochs(folder: RunFolder, model, epochs, best=(), keep_last: int = 10) -> None:
    for epoch in epochs:
        folder.save_epoch(model, epoch, {"global_step": 10 * epoch}, improved=epoch in best, keep_last=keep_last)


def test_epochs_rotate_and_last_and_best_link_to_their_epoch(tmp_path, model):
    folder = RunFolder(tmp_path)
    _save_epochs(folder, model, [1, 2, 3, 4], best=(2,), keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["best.pt", "epoch_0003.pt", "epoch_0004.pt", "last.pt"]
    assert (tmp_path / "last.pt").samefile(tmp_path / "epoch_0004.pt")
    assert read_checkpoint(tmp_path / "best.pt")["epoch"] == 2  # its epoch file rotated away, the link keeps it
    assert read_checkpoint(tmp_path / "last.pt")["global_step"] == 40
    assert not list(tmp_path.glob(".*crackseg-tmp*"))


def test_resume_source_is_last_then_the_newest_intact_epoch(tmp_path, model, capsys):
    folder = RunFolder(tmp_path)
    assert folder.find_resume_source("auto") is None
    _save_epochs(folder, model, [1, 2, 3])
    source, payload = folder.find_resume_source("auto")
    assert source == tmp_path / "last.pt" and payload["epoch"] == 3
    (tmp_path / "last.pt").unlink()
    (tmp_path / "last.pt").write_bytes(b"torn")
    (tmp_path / "epoch_0003.pt").write_bytes(b"torn too")
    source, payload = folder.find_resume_source("auto")
    assert source == tmp_path / "epoch_0002.pt" and payload["epoch"] == 2
    assert "resuming from" in capsys.readouterr().err
    source, payload = folder.find_resume_source(str(tmp_path / "epoch_0001.pt"))
    assert payload["epoch"] == 1
    with pytest.raises(InputError, match="already holds checkpoints"):
        folder.find_resume_source("none")
    for path in tmp_path.glob("epoch_*.pt"):
        path.write_bytes(b"torn")
    with pytest.raises(InputError, match="no intact epoch_NNNN.pt"):
        folder.find_resume_source("auto")


def test_a_run_whose_last_link_was_removed_resumes_from_its_newest_epoch_not_afresh(tmp_path, model, capsys):
    folder = RunFolder(tmp_path)
    _save_epochs(folder, model, [1, 2, 3], best=(1,), keep_last=2)
    (tmp_path / "last.pt").unlink()
    source, payload = folder.find_resume_source("auto")
    assert source == tmp_path / "epoch_0003.pt" and payload["epoch"] == 3
    assert f"{tmp_path / 'last.pt'}: missing; resuming from" in capsys.readouterr().err
    for path in tmp_path.glob("epoch_*.pt"):
        path.unlink()
    with pytest.raises(InputError, match="last.pt: missing, and no intact epoch_NNNN.pt .* --resume PATH"):
        folder.find_resume_source("auto")  # best.pt alone: neither afresh over it nor from it


def test_setup_files_are_written_and_the_split_read_back(tmp_path):
    folder = RunFolder(tmp_path / "run")
    assert folder.saved_split() is None
    split = {"train": ["a", "b"], "val": ["c"], "test": []}
    folder.write_setup({"lr": 0.1}, {"global_batch": 4}, split, ["x.jpg: not a readable image"])
    assert folder.saved_split() == split
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"options": {"lr": 0.1}, "resolved": {"global_batch": 4}}
    assert (tmp_path / "run" / "skipped.txt").read_text() == "x.jpg: not a readable image\n"


def test_other_ranks_write_nothing(tmp_path, model):
    folder = RunFolder(tmp_path / "run", is_main=False)
    with folder:
        folder.write_setup({}, {}, {"train": [], "val": [], "test": []}, [])
        _save_epochs(folder, model, [1])
        folder.open_events(0)
        folder.log_step(1, {"loss": 1.0})
    assert not (tmp_path / "run").exists()



def _dead_pid() -> int:
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _lock(folder, **fields) -> None:
    import socket

    record = {"pid": 1, "host": socket.gethostname(), "process_start": None, "since": "earlier", "job": None, "attempt": 0}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lock").write_text(json.dumps({**record, **fields}))


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    import os
    import socket

    first = RunFolder(tmp_path / "run")
    first.acquire()
    record = json.loads((tmp_path / "run" / "lock").read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    with pytest.raises(InputError, match=rf"in use by pid {os.getpid()} on {socket.gethostname()}.*delete .*lock"):
        RunFolder(tmp_path / "run").acquire()
    first.release()
    assert not (tmp_path / "run" / "lock").exists()
    second = RunFolder(tmp_path / "run")
    second.acquire()
    second.release()


def test_stale_locks_are_taken_over_with_a_warning_and_foreign_hosts_are_not(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _lock(run, pid=_dead_pid())
    folder = RunFolder(run)
    folder.acquire()
    assert "no longer running; taking it over" in capsys.readouterr().err
    folder.release()

    _lock(run, pid=1, host="elsewhere.example")
    with pytest.raises(InputError, match="in use by pid 1 on elsewhere.example"):
        RunFolder(run).acquire()

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    _lock(run, pid=1, host="elsewhere.example", job="job7", attempt=0)  # rank 0 of attempt 0 ran on another node
    RunFolder(run).acquire()
    assert "left by attempt 0 of this torchrun job" in capsys.readouterr().err
    _lock(run, pid=1, host="elsewhere.example", job="job7", attempt=1)  # the same attempt elsewhere: live
    with pytest.raises(InputError, match="in use"):
        RunFolder(run).acquire()


def test_temp_files_of_a_killed_save_are_removed_on_the_next_start(tmp_path, model):
    folder = RunFolder(tmp_path)
    _save_epochs(folder, model, [1])
    orphans = [tmp_path / ".epoch_0002.pt.x1y2.crackseg-tmp", tmp_path / ".last.pt.4242.crackseg-tmp"]
    for orphan in orphans:
        orphan.write_bytes(b"half a checkpoint")
    folder.acquire()
    assert not any(orphan.exists() for orphan in orphans)
    assert (tmp_path / "epoch_0001.pt").exists()
    folder.release()


def test_the_run_folder_must_be_a_writable_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"--run .*file: is a file, not a folder"):
        RunFolder(tmp_path / "file").acquire()


def test_a_resume_keeps_the_checkpoints_last_logged_step_and_drops_the_unfinished_epochs(tmp_path):
    """The last step of a saved epoch is logged before the save and never again; what came after it is the epoch a
    kill cut short, logged again by the resumed run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunFolder(tmp_path / "run") as folder:
        folder.open_events(0)
        for step in range(1, 7):  # epoch 1 ends at step 4 (saved); 5 and 6 are the killed epoch's
            folder.log_step(step, {"loss": float(step)})
    with RunFolder(tmp_path / "run") as folder:
        folder.open_events(4)
        folder.log_step(5, {"loss": 50.0})
    events = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(event.step, event.value) for event in events.Scalars("train/loss")] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 50)]
