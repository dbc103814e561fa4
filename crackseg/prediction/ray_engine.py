"""``predict --engine ray``: the run's work list predicted by a pool of Ray actors, on an existing Ray cluster or a local one.

Ray Data streams the items of :func:`crackseg.prediction.work.work_list` (photos, and bands of each raster's tile rows)
through ``map_batches`` with an actor pool, one model per actor. The model's files travel through Ray's object store,
so the nodes need no copy of them; each actor reads its own inputs (object storage, or paths that every node sees),
writes an item's files with predict's own writers into a scratch folder and returns their bytes with its table rows.
The driver stays the one writer of ``--out``: it writes each item's files as they arrive (so a driver killed mid-run
leaves finished files for ``--skip-existing``), uploads them for an --out in object storage, joins each raster's bands
as torchrun's rank 0 does, and writes the tables.

Faults: an actor process that dies is restarted by Ray, which runs its item again, at most :data:`RETRIES` times
(then the item is listed in errors.csv); the driver writes each item once, whichever attempt returned it. An input that
cannot be read is an error row at once, never retried. Ctrl-C and SIGTERM stop the driver as they stop a local run
(Ray's own SIGTERM handler, which would exit mid-write, is put back to crackseg's); the actors' scratch folders of a
run share one parent in the temp folder, removed with the run. A ``--ray-address`` where nothing listens fails in
seconds, before Ray would retry it for minutes.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from crackseg.core.errors import InputError, RunError, require
from crackseg.core.files import write_atomic
from crackseg.core.storage import RemoteFile, StorageError
from crackseg.core.version import __version__
from crackseg.data.images import describe_error, load_image
from crackseg.data.rasters import RasterSource, gdal_settings, open_raster
from crackseg.model import distributed
from crackseg.model.inference import Predictor
from crackseg.model.options import InferenceOptions
from crackseg.model.runtimes import choose_runtime, load_runtime
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, Records, predictions, write_image_outputs
from crackseg.prediction.streamed import RasterRun, band_paths, join_raster, predict_raster, raster_outputs
from crackseg.prediction.work import Job, Plan, Work, work_list

if TYPE_CHECKING:
    from crackseg.model.runtimes import RuntimeChoice
    from crackseg.prediction.options import PredictOptions

RETRIES = 3  # times an item is run again after its actor died running it
CONNECT_TIMEOUT_S = 10  # for a cluster's address to accept a connection
EXECUTOR_STOP_S = 60  # the most the driver waits for Ray Data's executor to stop before ending Ray
RAY_DATA_THREADS = ("StreamingExecutor-", "iter_threaded", "ray-data-metadata-prefetch")  # their names' beginnings in Ray Data


class RayEngine:
    """The work list on a pool of Ray actors (--ray-address, --actors, --gpus-per-actor, --cpus-per-actor); the driver
    loads the model on the CPU and stays the one writer."""

    def check(self, env: distributed.Environment) -> None:
        _require_ray()
        if env.distributed:
            raise InputError("--engine ray spreads the work over Ray's actors; start it as one process, without torchrun")

    def model_device(self, env: distributed.Environment) -> torch.device:
        return torch.device("cpu")  # Ray's actors load their own

    def run(self, job: Job) -> None:
        """Predict the plan's inputs on Ray actors into ``run.folder`` (and ``plan.staged``), adding their rows to ``records``."""
        plan, run, options, records = job.plan, job.run, job.options, job.records
        ray = _require_ray()
        scratch = f"crackseg-ray-{uuid.uuid4().hex[:12]}"  # the parent of this run's scratch folders, on every node
        _connect(ray, options.ray_address)
        try:
            actors, gpus = _pool_size(ray, options, job.choice)
            work = _unfinished(plan, run, work_list(plan, actors), records)
            if work:
                spec = _Job([ray.put(_model_files(job.choice.path))], job.choice.path.name, job.choice.options,
                            options.cpus_per_actor or 1, run.threshold, plan.spec, run.save_prob, run.overviews, options.max_pixels,
                            scratch, os.getcwd())
                _run(ray, spec, (min(actors, len(work)), gpus), work, _Collector(plan, run, records))
        finally:
            _await_ray_data()
            ray.shutdown()
            shutil.rmtree(Path(tempfile.gettempdir()) / scratch, ignore_errors=True)  # what actors killed mid-item left here


def _await_ray_data() -> None:
    """Wait for Ray Data's threads to stop: its executor's, and those that fetch the blocks a closed iterator had asked
    for. Ray Data waits 2 s for its executor; a thread still calling Ray when ``ray.shutdown()`` ends the core worker (a
    loaded machine, a run stopped by a failure) makes Ray end the whole process with status 1."""
    deadline = time.monotonic() + EXECUTOR_STOP_S
    for thread in threading.enumerate():
        if thread.name.startswith(RAY_DATA_THREADS) and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def _check_listening(address: str | None, named_by: str) -> None:
    """One line within seconds when nothing listens at a cluster's host:port (Ray would retry for many minutes)."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not port.isdigit():
        return  # not host:port: Ray's own message says what is wrong
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        where = f"{named_by} {address}" if named_by else f"Ray cluster {address}, the one ray start last started on this machine"
        raise InputError(f"{where}: nothing answers at {host}:{port} ({error.strerror or error}); is the Ray cluster running, "
                         "and is this its address (ray status prints it; ray stop forgets a cluster that is gone)?") from None


def _resolved_address(ray, address: str | None) -> tuple[str | None, str]:
    """The cluster address ray.init will go to, as Ray resolves it (--ray-address, RAY_ADDRESS, else the cluster
    ``ray start`` last started on this machine, whose address file outlives it), and the flag that named it ("" for
    that file)."""
    if address and address != "auto":  # ray.init takes it over RAY_ADDRESS
        return address, "--ray-address"
    named_by = "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else ""
    try:
        return ray._private.services.get_ray_address_from_environment(address, None), named_by
    except (AttributeError, ConnectionError):  # another Ray's internals; "auto" with no cluster: ray.init says so
        return address or os.environ.get("RAY_ADDRESS"), named_by


def _require_ray():
    """Ray, or a one-line error naming the extra that installs it."""
    ray = require("ray", "ray", "--engine ray")
    require("ray.data", "ray", "--engine ray")
    return ray


@dataclass(frozen=True)
class _Job:
    """What every actor needs, sent once: the model's files (an object reference in a list, so Ray leaves it to the
    actor to fetch) and how to predict and write."""

    model_files: list
    model_name: str  # the model's path among its files
    inference: InferenceOptions
    threads: int
    threshold: float
    spec: OutputSpec  # the photos'
    save_prob: int | None
    overviews: bool
    max_pixels: int
    scratch: str  # the folder below each node's temp folder that holds this run's scratch folders
    working_folder: str  # the driver's: relative input paths are below it (an actor runs where its node started)


@dataclass(frozen=True)
class _Result:
    """One item done by an actor: its files' bytes by path below --out, its rows (a photo) or pixel counts (a band), or
    what went wrong."""

    item: Work
    files: dict[str, bytes]
    rows: tuple[dict, list[dict]] | None = None
    counts: tuple[int, int] = (0, 0)
    error: str | None = None


class _Actor:
    """One model, loaded once per actor process; called with batches of pickled work items. Nothing is left on the node:
    the model's files are removed once loaded, and each item's files once read back."""

    def __init__(self, job: _Job):
        import ray
        import torch

        torch.set_num_threads(job.threads)
        self.job = job
        with tempfile.TemporaryDirectory(prefix="crackseg-model-") as folder:
            for name, content in ray.get(job.model_files[0]).items():
                write_atomic(Path(folder) / name, content)
            runtime = load_runtime(choose_runtime(Path(folder) / job.model_name, job.inference))
        self.predictor = Predictor(runtime.model, runtime.device, job.inference, runtime.amp_dtype)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        done = [pickle.dumps(self._predict(pickle.loads(item))) for item in batch["item"]]
        return {"result": np.array(done, dtype=object)}

    def _predict(self, item: Work) -> _Result:
        parent = Path(tempfile.gettempdir()) / self.job.scratch
        parent.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="crackseg-item-", dir=parent) as scratch:
            folder = PredictionsFolder(Path(scratch))
            try:
                return self._photo(item, folder) if item.band is None else self._band(item, folder)
            except StorageError as error:
                return _Result(item, {}, error=error.reason)
            except Exception as error:  # any input that fails is reported, and the actor goes on
                return _Result(item, {}, error=describe_error(error) if item.band is None else str(error))

    def _photo(self, item: Work, folder: PredictionsFolder) -> _Result:
        image = load_image(self._source(item))
        ((_, prediction),) = predictions(self.predictor, [(item.key, image)], self.job.threshold, self.job.spec)
        try:
            rows = write_image_outputs(folder, item.path, item.name, image, prediction, self.job.threshold, self.job.spec)
        except OSError as error:
            return _Result(item, {}, error=f"cannot write outputs: {error}")
        return _Result(item, _contents(folder, folder.outputs(item.name, self.job.spec)), rows=rows)

    def _band(self, item: Work, folder: PredictionsFolder) -> _Result:
        job = self.job
        run = RasterRun(self.predictor, job.threshold, folder, job.save_prob, job.overviews, job.spec.made_with)
        outputs = raster_outputs(folder, item.name, job.save_prob)
        source_path = self._source(item)
        with gdal_settings(), RasterSource(source_path, job.max_pixels, open_raster(source_path)) as source:
            counts = predict_raster(source, outputs, run, item.band, progress=False)
        return _Result(item, _contents(folder, [path for path in band_paths(outputs, item.band) if path.exists()]), counts=counts)

    def _source(self, item: Work) -> Path | RemoteFile:
        """Where the actor reads the item: a relative path below the driver's working folder, as the driver meant it
        (the tables keep the path as given)."""
        if isinstance(item.path, RemoteFile) or item.path.is_absolute():
            return item.path
        return Path(self.job.working_folder) / item.path


def _contents(folder: PredictionsFolder, paths: list[Path]) -> dict[str, bytes]:
    """Files by their path below the folder, as the driver writes them below --out."""
    return {path.relative_to(folder.root).as_posix(): path.read_bytes() for path in paths}


def _connect(ray, address: str | None) -> None:
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)  # an actor's death is retried, and reported in errors.csv
    _check_listening(*_resolved_address(ray, address))
    sigterm = signal.getsignal(signal.SIGTERM)
    try:  # None: RAY_ADDRESS, else a cluster started on this machine (ray start), else a local Ray, as Ray resolves it
        ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = f"--ray-address {address}" if address else "Ray"
        raise InputError(f"{where}: cannot start or reach a Ray cluster: {str(error).splitlines()[0]} (is it running, "
                         "and is RAY_AUTH_TOKEN set where it uses token authentication?)") from None
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)  # Ray's exits at once; crackseg's stops the run as Ctrl-C does
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the driver shows its own, as predict does
    context.print_on_execution_start = False
    context.max_errored_blocks = -1  # an item whose actor died RETRIES + 1 times is an error row; the others go on


def _pool_size(ray, options: PredictOptions, choice: RuntimeChoice) -> tuple[int, float]:
    """(actors, GPUs per actor) from the flags and what the cluster has: --actors (None: one per GPU, else one per
    --cpus-per-actor CPUs), --gpus-per-actor (None: 1 on a cluster with GPUs, else 0), --cpus-per-actor (None: 1, the
    threads of each actor's model, on which a CPU model's last bits depend)."""
    cpus_per_actor = options.cpus_per_actor or 1
    resources = ray.cluster_resources()
    gpus = resources.get("GPU", 0.0)
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    per_actor = options.gpus_per_actor
    if per_actor is None:
        per_actor = 1.0 if gpus and choice.device != "cpu" else 0.0
    if not gpus and per_actor:
        raise InputError(f"--gpus-per-actor {per_actor:g}: the Ray cluster has 0 GPUs; pass --gpus-per-actor 0 for CPU actors")
    for flag, wanted, kind in (("--gpus-per-actor", per_actor, "GPU"), ("--cpus-per-actor", cpus_per_actor, "CPU")):
        largest = max((node.get(kind, 0.0) for node in nodes), default=0.0)
        if wanted > largest:  # no node could ever host an actor: Ray would wait for one for ever
            raise InputError(f"{flag} {wanted:g}: the largest node of the Ray cluster has {largest:g} {kind}s")
    if per_actor == 0 and choice.device.startswith("cuda"):
        raise InputError(f"--device {choice.device} needs GPU actors: pass --gpus-per-actor (e.g. 1)")
    actors = options.actors or (int(gpus // per_actor) if per_actor else int(resources.get("CPU", 1) // cpus_per_actor))
    return max(1, actors), per_actor


def _unfinished(plan: Plan, run: RasterRun, work: list[Work], records: Records) -> list[Work]:
    """The items to predict; the inputs whose outputs ``--skip-existing`` keeps get their rows now, as locally."""
    kept = {raster.key for raster in plan.rasters if plan.kept_raster(raster.key)}
    for item in work:
        rows = plan.kept_rows(item.key, item.path, item.name, run.threshold) if item.band is None else None
        if rows is not None:
            kept.add(item.key)
            records.add(item.key, *rows)
    for raster in plan.rasters:
        if raster.key in kept:
            join_raster(raster, run, None, records)
    return [item for item in work if item.key not in kept]


def _run(ray, job: _Job, size: tuple[int, float], work: list[Work], collector: _Collector) -> None:
    """Stream ``work`` through ``size`` (actors, GPUs each) actors, one item per batch, into ``collector``."""
    actors, gpus = size
    items = ray.data.from_items([{"item": pickle.dumps(item)} for item in work], override_num_blocks=len(work))
    with warnings.catch_warnings():  # max_task_retries has no named parameter yet (setup.cfg holds Ray below 2.64)
        warnings.simplefilter("ignore", DeprecationWarning)
        results = items.map_batches(_Actor, fn_constructor_kwargs={"job": job}, batch_size=1, num_cpus=job.threads,
                                    num_gpus=gpus or None, compute=ray.data.ActorPoolStrategy(size=actors), max_task_retries=RETRIES)
    rows = iter(results.iter_rows())
    with tqdm(total=len(work), desc="predict", unit="item", disable=None) as bar:
        try:
            for row in rows:
                if collector.take(pickle.loads(row["result"])):
                    bar.update()
        except ray.exceptions.RayError as error:  # actors that cannot start: the model or crackseg missing on the nodes
            reason = next((line.strip() for line in reversed(str(error).splitlines()) if line.strip()), type(error).__name__)
            raise RunError(f"Ray's actors could not run: {reason} (is crackseg {__version__}, with the extras the run needs, "
                           "installed on every node? docs/scale.md)") from None
        finally:
            rows.close()  # stops Ray Data's executor now, however the loop ended, rather than when the iterator is collected
    collector.finish(work)


class _Collector:
    """The driver's side: each item's files written once, its rows recorded, each raster joined when its bands are in."""

    def __init__(self, plan: Plan, run: RasterRun, records: Records):
        self.plan, self.run, self.records = plan, run, records
        self.done: set[tuple[int, tuple[int, int] | None]] = set()
        self.bands: dict[int, dict[int, tuple[str | None, tuple[int, int]]]] = {}

    def take(self, result: _Result) -> bool:
        """Record one result; False for a second copy of an item already taken (a retried run of it)."""
        item = result.item
        if (item.key, item.band) in self.done:
            return False
        self.done.add((item.key, item.band))
        error = result.error
        if error is None:
            try:
                for name, content in result.files.items():
                    write_atomic(self.run.folder.root / name, content)
                if item.band is None:
                    self.plan.upload(item.key)
            except (OSError, StorageError) as failure:
                error = self.plan.write_error(failure)
        if item.band is not None:
            self._band(item, error, result.counts)
        elif error is not None:
            self.records.fail(item.key, item.path, item.name, error)
        else:
            row, cracks = result.rows
            self.records.add(item.key, row | {"mask": str(self.plan.folder.mask(item.name))}, cracks)
        return True

    def finish(self, work: list[Work]) -> None:
        """Items that Ray gave up on (their actor died every time) are errors."""
        for item in work:
            if (item.key, item.band) not in self.done:
                self.take(_Result(item, {}, error=f"its Ray actor died {RETRIES + 1} times predicting it"))

    def _band(self, item: Work, error: str | None, counts: tuple[int, int]) -> None:
        index, count = item.band
        bands = self.bands.setdefault(item.key, {})
        bands[index] = (error, counts)
        if len(bands) == count:
            raster = next(raster for raster in self.plan.rasters if raster.key == item.key)
            join_raster(raster, self.run, [bands[i] for i in range(count)], self.records)
            if item.key in self.records.rows:
                self.plan.upload(item.key)


def _model_files(path: Path) -> dict[str, bytes]:
    """The model's files by their path below the model's parent folder: the file, an OpenVINO model's .bin beside its
    .xml, or every file of a safetensors folder."""
    if path.is_dir():
        return {file.relative_to(path.parent).as_posix(): file.read_bytes() for file in sorted(path.rglob("*")) if file.is_file()}
    weights = path.with_suffix(".bin")
    files = [path] + ([weights] if path.suffix.lower() == ".xml" and weights.is_file() else [])
    return {file.name: file.read_bytes() for file in files}
