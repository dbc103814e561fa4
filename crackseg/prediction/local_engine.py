"""``predict --engine local``: this process predicts its share of the work, or torchrun's processes theirs.

Photos are decoded in loader workers (on a GPU, JPEGs in batches there: :mod:`crackseg.prediction.decoding`) and their
files made (masks encoded, cracks measured, overlays drawn) in measuring processes, beside the model: in threads they
shared one GIL and measuring fell far behind a GPU. Writer threads hand each photo to a process, upload its files and
keep the photos' order; rasters are predicted by windows (:mod:`crackseg.prediction.streamed`), each process a share of
their tile rows, rank 0 joining the parts.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

from crackseg.core.storage import RemoteFile, StorageError
from crackseg.core.workers import quiet_when_parent_stops
from crackseg.data.images import describe_error, load_image
from crackseg.model import distributed
from crackseg.prediction.decoding import DECODE_BATCH, decode_batch, read_photo
from crackseg.prediction.outputs import predictions, write_image_outputs
from crackseg.prediction.streamed import predict_rasters
from crackseg.prediction.work import Job, Plan, share, work_list


class LocalEngine:
    def check(self, env: distributed.Environment) -> None:
        pass

    def model_device(self, env: distributed.Environment) -> torch.device:
        return env.device

    def run(self, job: Job) -> None:
        plan, env = job.plan, job.env
        _predict_photos(job)
        kept = distributed.broadcast_from_main({raster.key for raster in plan.rasters if plan.kept_raster(raster.key)} if env.is_main else None)
        predict_rasters(plan.rasters, job.run, env, job.records, kept, plan.upload, plan.staged)


class _Images(torch.utils.data.Dataset):
    """Inputs for loader workers: (key, decoded photo, None, None), with ``raw_jpegs`` (key, None, a JPEG's bytes, None)
    for the device to decode (:mod:`crackseg.prediction.decoding`); a file that fails to download or decode yields
    (key, None, None, its error message)."""

    def __init__(self, inputs: list[tuple[int, Path | RemoteFile]], raw_jpegs: bool):
        self.inputs = inputs
        self.raw_jpegs = raw_jpegs

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        key, path = self.inputs[index]
        try:
            return key, *(read_photo(path) if self.raw_jpegs else (load_image(path), None)), None
        except StorageError as error:
            return key, None, None, error.reason
        except Exception as error:  # any undecodable input is reported, the others go on
            return key, None, None, describe_error(error)


def _predict_photos(job: Job) -> None:
    """This process's share of the photos: decoded in loader workers, written in writer threads."""
    plan, env, records = job.plan, job.env, job.records
    todo = []
    for item in share(work_list(plan, env.world_size), env.rank, env.world_size):
        if item.band is not None:
            continue
        rows = plan.kept_rows(item.key, item.path, item.name, job.run.threshold)
        if rows is not None:
            records.add(item.key, *rows)
        else:
            todo.append((item.key, item.path))
    names = {key: (path, name) for key, path, name in plan.photos}
    workers = default_workers(env.device) if job.options.workers is None else job.options.workers
    on_device = job.options.decode == "device" or (job.options.decode == "auto" and env.device.type == "cuda")
    loader = torch.utils.data.DataLoader(
        _Images(todo, on_device), batch_size=None, num_workers=workers, pin_memory=env.device.type == "cuda",
        prefetch_factor=4 if workers else None, worker_init_fn=quiet_when_parent_stops,
    )
    decoded: dict[int, torch.Tensor] = {}  # each photo until its files are written
    images = _photos(loader, env.device, lambda key, reason: records.fail(key, *names[key], reason), decoded)
    pending: deque[tuple[int, Future]] = deque()

    def collect(wait: bool) -> None:
        """Record the written photos in order, as far as they are done (all of them with ``wait``)."""
        while pending and (wait or pending[0][1].done()):
            key, future = pending.popleft()
            try:
                records.add(key, *future.result())
            except (OSError, StorageError) as error:
                records.fail(key, *names[key], plan.write_error(error), on_stderr=False)

    with _measurers(workers if todo else 0) as measurers, ThreadPoolExecutor(workers) if workers else _Inline() as writers:
        try:
            found = predictions(job.predictor, images, job.run.threshold, plan.spec)
            for key, prediction in tqdm(found, total=len(todo), desc="predict", disable=None if env.is_main else True, unit="img"):
                pending.append((key, writers.submit(_write_photo, plan, measurers, key, names[key], decoded.pop(key), prediction,
                                                    job.run.threshold)))
                collect(wait=False)
            collect(wait=True)
        except BaseException:
            measurers.shutdown(cancel_futures=True)  # no photo queued for writing is written after the run stopped
            writers.shutdown(cancel_futures=True)
            raise


def _photos(loader, device: torch.device, fail: Callable[[int, str], None], decoded: dict[int, torch.Tensor]):
    """(key, photo) as the loader gives them, JPEG bytes decoded in batches on ``device`` on the way; a photo that
    cannot be read goes to ``fail`` (key, reason). Each photo is also kept in ``decoded``."""
    raws: list[tuple[int, torch.Tensor]] = []

    def batch():
        for (key, _), image in zip(raws, decode_batch([raw for _, raw in raws], device) if raws else []):
            if isinstance(image, str):
                fail(key, image)
            else:
                decoded[key] = image
                yield key, image
        raws.clear()

    for key, image, raw, error in loader:
        if raw is not None:
            raws.append((key, raw))
            if len(raws) == DECODE_BATCH:
                yield from batch()
        elif error is not None:
            fail(key, error)
        else:
            decoded[key] = image
            yield key, image
    yield from batch()


def _write_photo(plan: Plan, measurers: Executor, key: int, named: tuple[Path | RemoteFile, str], image: torch.Tensor,
                 prediction: torch.Tensor, threshold: float) -> tuple[dict, list[dict]]:
    """One photo's files made (in a measuring process) and, for an --out in object storage, uploaded as soon as they are.
    ``prediction``: probabilities, or the mask where no probabilities are saved (a quarter of the bytes to send)."""
    shown = image.cpu().numpy() if plan.spec.overlay else None  # the photo travels to the process only to be drawn on
    rows = measurers.submit(write_image_outputs, plan.folder, *named, shown, prediction.numpy(), threshold, plan.spec).result()
    plan.upload(key)
    return rows


def _measurers(count: int) -> Executor:
    """``count`` measuring processes, leaving Ctrl-C to this process, which stops them; none: in this thread.

    They are forked from a fresh server process (the CUDA and thread state of this one stay here) that imported the
    measuring code once: spawned, each imported it itself. Each still imports the program's main module, as
    multiprocessing does (nothing for ``python -m crackseg``, crackseg's light command-line module for ``crackseg``).
    """
    if not count:
        return _Inline()
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["crackseg.prediction.outputs"])
    else:
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(count, mp_context=context, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))


def default_workers(device: torch.device) -> int:
    """Decoding processes (and as many measuring processes) when the user names none.

    On CPU the model's threads already use every core, and decoding and writing beside them
    slowed prediction down more than doing them in turn (docs/benchmarks.md).
    """
    return 0 if device.type == "cpu" else distributed.spare_cores()


class _Inline(Executor):
    """Runs each task as it is submitted: with --workers 0 all work stays in the main thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # delivered by result(), as a thread pool would
            future.set_exception(error)
        return future
