"""The folder a synthetic dataset is written to: refused where it holds other files, replaced whole or not at all.

:func:`dataset_folder` gives a run a staging folder inside OUT and puts what it wrote in the place of the earlier
dataset only once every file is written; a run stopped during that swap is undone by the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.files import ensure_writable_folder, remove_orphan_temps, write_atomic
from crackseg.core.locks import FolderLock

DATASET_PARTS = ("images", "masks", "truth", "truth.json")
STAGING = ".synth-staging"  # below OUT, where a run writes before its dataset takes the earlier one's place
SYNTH_NAME = re.compile(r"images/\d{5,}\.jpg|(masks|truth)/\d{5,}\.png|truth\.json")


@contextlib.contextmanager
def dataset_folder(out: Path, overwrite: bool) -> Iterator[Path]:
    """A staging folder in ``out`` to write a whole dataset into, put in the place of what an earlier synth run left
    there only once every file is written: a run stopped part way leaves the earlier dataset whole, never a mix of two.

    ``out`` is locked meanwhile; a staging folder an interrupted run left is removed.
    """
    made = not out.exists()
    ensure_writable_folder(out, "OUT")
    lock = FolderLock(out, "crackseg synth", "OUT")
    lock.acquire()
    staging = out / STAGING
    try:
        _undo_swap(staging, out)  # a run killed while swapping: its earlier dataset back first
        _claim(out, overwrite)
        shutil.rmtree(staging, ignore_errors=True)
        for sub in ("images", "masks"):
            (staging / sub).mkdir(parents=True)
        yield staging
        _swap(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        lock.release()
        if made and out.is_dir() and not any(out.iterdir()):  # a run that stopped (out of memory, Ctrl-C) leaves no empty folder
            out.rmdir()


def _claim(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` where the dataset's folders cannot go, or that holds files synth did not write there, or (without
    ``overwrite``) an earlier dataset."""
    for name in DATASET_PARTS:
        folder = not name.endswith(".json")
        if os.path.lexists(out / name) and (out / name).is_dir() != folder:
            what = "a broken link" if not (out / name).exists() else "a file" if folder else "a folder"
            raise InputError(f"{out / name} is {what}, not a {'folder' if folder else 'file'}; synth writes its "
                             f"{name if folder else 'truth table'} there: move it or choose another OUT")
    previous = _previous_files(out)
    if previous and not overwrite:
        raise InputError(f"{previous[0].parent} already holds files; choose another folder or pass --overwrite")


def _previous_files(out: Path) -> list[Path]:
    """Files an earlier synth run left in ``out``; anything synth does not write there is an error.

    ``--overwrite`` replaces a synthetic dataset, never a folder of other files. Temp files of
    an interrupted run are removed first.
    """
    for folder in (out, out / "images", out / "masks", out / "truth"):
        remove_orphan_temps(folder)
    found = sorted(p for sub in ("images", "masks", "truth") if (out / sub).is_dir() for p in (out / sub).iterdir())
    found += [out / "truth.json"] if (out / "truth.json").exists() else []
    foreign = [p for p in found if not SYNTH_NAME.fullmatch(p.relative_to(out).as_posix())]
    if foreign:
        raise InputError(f"{foreign[0]}: not written by crackseg synth; write the synthetic dataset into another folder")
    return found


def _swap(staging: Path, out: Path) -> None:
    """The parts in ``staging`` in the place of ``out``'s, which go to ``staging/replaced`` first; ``staging/swap.json``
    names both sides before anything moves, so that a swap stopped part way can be undone (:func:`_undo_swap`)."""
    old = [name for name in DATASET_PARTS if os.path.lexists(out / name)]
    new = [name for name in DATASET_PARTS if os.path.lexists(staging / name)]
    (staging / "replaced").mkdir()
    write_atomic(staging / "swap.json", json.dumps({"old": old, "new": new}))
    try:
        for name in old:
            os.replace(out / name, staging / "replaced" / name)
        for name in new:
            os.replace(staging / name, out / name)
    except BaseException:
        _undo_swap(staging, out)
        raise
    (staging / "swap.json").unlink()


def _undo_swap(staging: Path, out: Path) -> None:
    """The earlier dataset back in ``out`` from a swap that did not finish (it failed, or its run was killed)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        plan = json.loads((staging / "swap.json").read_text())
        for name in plan["new"]:  # this run's parts, moved in before the swap stopped, out again
            if os.path.lexists(out / name) and not os.path.lexists(staging / name):
                os.replace(out / name, staging / name)
        for name in plan["old"]:
            if os.path.lexists(staging / "replaced" / name):
                os.replace(staging / "replaced" / name, out / name)
