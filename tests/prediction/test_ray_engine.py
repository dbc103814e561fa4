"""predict --engine ray: on a Ray cluster started by ``ray start`` (token authentication on, as Ray clusters now run) and
on a local Ray a run starts itself, compared with local runs; an actor and the driver killed mid-run."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import S3_KEY_ID, S3_SECRET, cli_result, csv_rows, pavement, write_geotiff
from PIL import Image
from services import ray_head

pytest.importorskip("ray.data")

RUN_S = 240  # the longest one predict may take here


@pytest.fixture(scope="module")
def cluster(s3_server, tmp_path_factory) -> dict[str, str]:
    """A Ray head with 2 CPUs on this machine, its nodes set up for the test S3 server as a cluster's would be for its
    store; yields the environment that reaches it (RAY_ADDRESS and its token)."""
    folder = tmp_path_factory.mktemp("ray")
    env = _clean_env() | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), "AWS_ENDPOINT_URL": s3_server,
                          "AWS_ACCESS_KEY_ID": S3_KEY_ID, "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                          "AWS_CONFIG_FILE": str(folder / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(folder / "none"),
                          "AWS_EC2_METADATA_DISABLED": "true"}
    with ray_head(env, 2, folder / "head.log") as address:
        yield env | {"RAY_ADDRESS": address}


def _clean_env() -> dict[str, str]:
    """This environment without torchrun's variables or a Ray address."""
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "RAY_ADDRESS")}


def _predict(*args, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "crackseg", "predict", *map(str, args), "--device", "cpu", "--workers", "0"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_S, cwd=cwd)


def _start(*args, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
    """predict started as from a terminal: SIGINT as Ctrl-C sends it (a parent that ignores it, as some test runners'
    processes do, would pass that on, and Python then never turns it into KeyboardInterrupt)."""
    command = [sys.executable, "-m", "crackseg", "predict", *map(str, args), "--device", "cpu", "--workers", "0"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _one_thread() -> dict[str, str]:
    """A local run with the threads of a default actor: a CPU model's probabilities are then the same bits."""
    return _clean_env() | {"OMP_NUM_THREADS": "1"}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".csv"
            and p.name != "summary.json"}


def _many_photos(folder: Path, count: int, size: int = 384) -> Path:
    folder.mkdir()
    for index in range(count):
        Image.fromarray(pavement(size, size, seed=index).transpose(1, 2, 0)).save(folder / f"p{index:02d}.jpg", quality=95)
    return folder


def _actor_pids() -> set[int]:
    """The processes of this machine that run predict's Ray actors (Ray names them after the actor class)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"MapBatches(_Actor)" in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def _wait_for(condition, process: subprocess.Popen, what: str, timeout: float = RUN_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"predict ended before {what}: {process.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_s3_in_s3_out_on_a_local_ray_writes_the_bytes_of_a_local_run(s3, photos, tmp_path, dark_checkpoint):
    """Photos, a bad photo and a GeoTIFF predicted by windows in two bands, one per actor, joined by the driver; the
    model an OpenVINO IR, whose .bin travels with its .xml. --ray-address local: a Ray of the run's own, whose actors
    inherit the driver's environment (the test store's settings)."""
    pytest.importorskip("rasterio")
    write_geotiff(photos / "ortho.tif", pavement(700, 600))
    (photos / "bad.jpg").write_bytes(b"not a jpeg")
    source, out = s3.upload(photos, "survey/photos"), s3.url("survey/pred/")
    flags = ["--checkpoint", dark_checkpoint, "--recursive", "--save-prob", 16, "--overlay", "--vectors", "geojson", "--overviews",
             "--tile", 256, "--overlap", 32]
    local = _predict(*flags, photos, "--out", tmp_path / "local", env=_one_thread())
    ray = _predict(*flags, source, "--out", out, "--engine", "ray", "--ray-address", "local", "--actors", 2, env=_clean_env())
    assert local.returncode == ray.returncode == 1, ray.stderr[-3000:]  # bad.jpg failed, the others are written
    assert "Traceback" not in ray.stderr and "bad.jpg: not a readable image" in ray.stderr
    remote = tmp_path / "remote"
    for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix="survey/pred/")["Contents"]:
        (remote / item["Key"][len("survey/pred/"):]).parent.mkdir(parents=True, exist_ok=True)
        (remote / item["Key"][len("survey/pred/"):]).write_bytes(s3.client.get_object(Bucket=s3.name, Key=item["Key"])["Body"].read())
    files = _files(tmp_path / "local")
    assert sorted(files) == sorted(_files(remote)) and "masks/ortho.tif" in files and "masks/sub/c.png" in files
    for name, content in _files(remote).items():  # a crack's vector names its input ("source"): the URL, or the file
        assert content.replace(source.encode(), b"") == files[name].replace(f"{photos}/".encode(), b""), name
    for table in ("predictions.csv", "cracks.csv", "errors.csv"):
        assert [{k: v for k, v in row.items() if k not in ("path", "mask")} for row in csv_rows(remote / table)] == \
            [{k: v for k, v in row.items() if k not in ("path", "mask")} for row in csv_rows(tmp_path / "local" / table)], table
    assert [row["path"] for row in csv_rows(remote / "predictions.csv")] == [source + name for name in ("a.jpg", "b.jpg", "ortho.tif", "sub/c.jpg")]


@pytest.mark.slow
def test_an_actor_killed_mid_run_loses_no_photo_and_writes_every_output_once(cluster, tmp_path, checkpoint):
    photos = _many_photos(tmp_path / "in", 48)  # enough left after the kill that the survivor does not finish before the restart
    before = _actor_pids()
    run = _start("--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray", "--actors", 2, env=cluster)
    masks = tmp_path / "out" / "masks"
    _wait_for(lambda: masks.is_dir() and any(masks.iterdir()), run, "a first mask")
    actors = _actor_pids() - before
    assert actors, "no actor process found"
    victim = min(actors)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + RUN_S  # Ray restarts the actor while work is left; on a busy machine the survivor may finish first
    while not _actor_pids() - before - actors and run.poll() is None:
        assert time.monotonic() < deadline, f"no restarted actor within {RUN_S} s"
        time.sleep(0.05)
    out, err = run.communicate(timeout=RUN_S)
    assert run.returncode == 0, err[-3000:]
    rows = csv_rows(tmp_path / "out" / "predictions.csv")
    assert sorted(Path(row["path"]).name for row in rows) == sorted(p.name for p in photos.iterdir())
    assert sorted(p.name for p in masks.iterdir()) == sorted(f"{p.stem}.png" for p in photos.iterdir())
    assert not (tmp_path / "out" / "errors.csv").exists() and "48 images predicted" in out


@pytest.mark.slow
def test_a_driver_killed_mid_run_is_finished_by_skip_existing(cluster, tmp_path, checkpoint):
    """The inputs named relative to the driver's folder, which the actors do not run in (ray start's, on each node)."""
    photos = _many_photos(tmp_path / "in", 12, size=256)
    flags = ["--checkpoint", checkpoint, "in", "--out", "out", "--engine", "ray", "--actors", 1]
    run = _start(*flags, env=cluster, cwd=tmp_path)
    masks = tmp_path / "out" / "masks"
    _wait_for(lambda: masks.is_dir() and len(list(masks.glob("*.png"))) >= 3, run, "three masks")
    run.kill()
    run.communicate(timeout=60)
    done = {p.name: p.stat().st_mtime_ns for p in masks.glob("*.png")}
    assert 3 <= len(done) < 12
    again = _predict(*flags, "--skip-existing", env=cluster, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {name: (masks / name).stat().st_mtime_ns for name in done} == done  # not predicted again
    rows = {Path(row["path"]).stem: row["status"] for row in csv_rows(tmp_path / "out" / "predictions.csv")}
    assert sorted(rows) == sorted(p.stem for p in photos.iterdir())
    assert sorted(stem for stem, status in rows.items() if status == "skipped: exists") == sorted(Path(n).stem for n in done)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, expected", [
    ("--gpus-per-actor", "1", "the Ray cluster has 0 GPUs; pass --gpus-per-actor 0 for CPU actors"),
    ("--cpus-per-actor", "3", "the largest node of the Ray cluster has 2 CPUs"),  # Ray would wait for such a node for ever
])
def test_actors_no_node_can_host_are_one_line(cluster, photos, tmp_path, checkpoint, flag, value, expected):
    result = _predict("--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray", flag, value, env=cluster)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [f"crackseg: error: {flag} {value}: {expected}"]


def test_engine_ray_without_ray_names_the_extra_and_writes_nothing(photos, tmp_path, checkpoint, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray"])
    assert code == 2 and err.splitlines() == ["crackseg: error: --engine ray needs ray; pip install 'crackseg[ray]'"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", [["--actors", "2"], ["--gpus-per-actor", "1"], ["--ray-address", "auto"], ["--cpus-per-actor", "2"]])
def test_ray_flags_without_engine_ray_are_one_line(photos, tmp_path, checkpoint, flag):
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", tmp_path / "out", *flag])
    assert code == 2 and err.splitlines() == [f"crackseg: error: {flag[0]} applies to --engine ray"]


def test_a_share_of_several_gpus_per_actor_is_one_line(photos, tmp_path, checkpoint):
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray",
                            "--gpus-per-actor", "1.5"])
    assert code == 2 and err.splitlines() == ["crackseg: error: --gpus-per-actor 1.5: above 1 it must be a whole number (Ray "
                                              "shares a GPU, but never splits several)"]


def test_the_work_list_is_split_alike_by_every_engine(photos, tmp_path):
    """torchrun's processes take every other photo and their band of each raster; together they take the whole list."""
    from crackseg.prediction.work import Plan, share, work_list

    rasters = [type("R", (), {"key": key, "path": Path(f"{key}.tif"), "name": str(key)}) for key in (3, 4)]
    plan = Plan(None, None, [(key, Path(f"{key}.jpg"), str(key)) for key in range(3)], rasters, None, {}, [])
    work = work_list(plan, 2)
    assert [(item.key, item.band) for item in work] == [(0, None), (1, None), (2, None), (3, (0, 2)), (3, (1, 2)), (4, (0, 2)), (4, (1, 2))]
    shares = [share(work, rank, 2) for rank in range(2)]
    assert [(item.key, item.band) for item in shares[0]] == [(0, None), (2, None), (3, (0, 2)), (4, (0, 2))]
    assert sorted(shares[0] + shares[1], key=work.index) == work
    assert share(work_list(plan, 1), 0, 1) == work_list(plan, 1)


def _scratch() -> set[str]:
    """The scratch folders of predict's Ray runs and actors in this machine's temp folder."""
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(("crackseg-ray-", "crackseg-item-"))}


@pytest.mark.slow
@pytest.mark.parametrize("stop, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_stop_the_driver_cleanly_and_leave_no_scratch(cluster, tmp_path, checkpoint, stop, status):
    """SIGTERM (a scheduler, kubectl delete) ends as Ctrl-C does: no crash, no scratch folder of an actor left."""
    before = _scratch()
    photos = _many_photos(tmp_path / "in", 40, size=256)  # the run is still going when the signal comes, on a busy machine too
    run = _start("--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray", "--actors", 1, env=cluster)
    masks = tmp_path / "out" / "masks"
    _wait_for(lambda: masks.is_dir() and any(masks.glob("*.png")), run, "a mask")
    run.send_signal(stop)
    _, err = run.communicate(timeout=120)
    assert run.returncode == status, err[-3000:]
    assert len(list(masks.glob("*.png"))) < 40  # stopped part way
    assert "Traceback" not in err and "SIGABRT" not in err and "core dumped" not in err
    time.sleep(2)  # the actors' processes are gone by now
    assert _scratch() <= before
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.startswith(".")]  # no lock, no temp file


def test_an_address_where_nothing_listens_fails_in_seconds(photos, tmp_path, checkpoint, monkeypatch):
    import socket

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # --ray-address goes first, as ray.init takes it
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    start = time.monotonic()
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray",
                            "--ray-address", f"127.0.0.1:{port}"])
    assert code == 2 and time.monotonic() - start < 30  # Ray itself would retry for minutes
    assert err.count("\n") == 1 and f"--ray-address 127.0.0.1:{port}: nothing answers" in err
    assert not (tmp_path / "out").exists()


def test_a_cluster_this_machine_started_that_is_gone_fails_in_seconds(photos, tmp_path, checkpoint, monkeypatch):
    """ray start leaves the cluster's address in a file that outlives it; Ray would try it for minutes."""
    import socket

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    (tmp_path / "ray" / "ray").mkdir(parents=True)
    (tmp_path / "ray" / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))
    start = time.monotonic()
    code, err = cli_result(["predict", "--checkpoint", checkpoint, photos, "--out", tmp_path / "out", "--engine", "ray"])
    assert code == 2 and time.monotonic() - start < 30
    assert err.count("\n") == 1 and f"Ray cluster 127.0.0.1:{port}, the one ray start last started on this machine" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_store_that_dies_mid_run_stops_the_driver_naming_what_is_missing(cluster, s3, tmp_path, checkpoint):
    """The driver uploads what the actors send: a store gone after the first photos stops it at once, as the local
    engine, with no scratch left, and --skip-existing then predicts exactly the rest."""
    from services import Relay

    before = _scratch()
    photos = _many_photos(tmp_path / "in", 6, size=128)
    relay = Relay(s3.endpoint.split("://")[1], cut_at=b"/survey/pred/masks/p03.png")
    env = cluster | {"AWS_ENDPOINT_URL": relay.endpoint}
    out = s3.url("survey/pred/")
    died = _predict("--checkpoint", checkpoint, photos, "--out", out, "--engine", "ray", "--actors", 1, env=env)
    assert died.returncode == 2 and "Traceback" not in died.stderr, died.stderr[-3000:]
    last = died.stderr.splitlines()[-1]
    assert last.startswith(f"crackseg: error: {out}masks/p03.png: the store stopped answering (cannot connect to {relay.endpoint}")
    assert f"{out} lacks the outputs of " in last and "rerun with --skip-existing to finish exactly those" in last
    stored = {item["Key"] for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix="survey/pred/masks/").get("Contents", [])}
    assert "survey/pred/masks/p03.png" not in stored
    time.sleep(2)
    assert _scratch() <= before

    relay.restore()
    again = _predict("--checkpoint", checkpoint, photos, "--out", out, "--skip-existing", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    table = tmp_path / "predictions.csv"
    table.write_bytes(s3.client.get_object(Bucket=s3.name, Key="survey/pred/predictions.csv")["Body"].read())
    statuses = {Path(row["mask"]).stem: row["status"] for row in csv_rows(table)}
    assert statuses == {f"p{index:02d}": "skipped: exists" if f"survey/pred/masks/p{index:02d}.png" in stored else "ok"
                        for index in range(6)}


@pytest.mark.slow
def test_the_driver_waits_for_ray_datas_executor_thread_before_ending_ray(cluster):
    """The driver finds Ray Data's executor and the iterator's fetching threads by their names; a Ray that named them
    otherwise would end a stopped driver with status 1 again on a loaded machine."""
    script = """
import threading, ray
from crackseg.prediction.ray_engine import RAY_DATA_THREADS, _await_ray_data
def named(*beginnings):
    return [t for t in threading.enumerate() if t.name.startswith(beginnings) and t.is_alive()]
ray.init(address="auto")
rows = iter(ray.data.range(64, override_num_blocks=8).map_batches(lambda batch: batch).iter_rows())
next(rows)
print(len(named("StreamingExecutor-")), len(named("iter_threaded")) > 0)
rows.close()
_await_ray_data()
print(len(named(*RAY_DATA_THREADS)))
ray.shutdown()
"""
    done = subprocess.run([sys.executable, "-c", script], env=cluster, capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "True", "0"], done.stdout
