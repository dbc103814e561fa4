"""The work of one predict run: what was decided before any of it was done (:class:`Plan`, from the inputs
:func:`crackseg.data.inputs.collect_inputs` lists), and how the engines split it.

Every engine splits one list (:func:`work_list`): each photo is an item, and each raster predicted by windows is
``bands`` items, bands of its tile rows (:func:`crackseg.model.inference.part_rows`) that are joined afterwards
(:func:`crackseg.prediction.streamed.join_raster`). The local engine takes every item; each torchrun process takes
its :func:`share` (every WORLD_SIZE-th photo, and band RANK of every raster); Ray's actors take items as they free up.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from crackseg.core.errors import InputError
from crackseg.core.staging import OutFailed, StagedFolder
from crackseg.core.storage import RemoteFile, StorageError
from crackseg.data.images import DECODE_ERRORS, describe_error, read_probability
from crackseg.data.rasters import unreadable_raster
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, saved_made_with, summarize_existing
from crackseg.prediction.uncertainty import uncertainty
from crackseg.prediction.streamed import Raster, RasterRun

if TYPE_CHECKING:
    from crackseg.model import distributed
    from crackseg.model.inference import Predictor
    from crackseg.model.runtimes import RuntimeChoice
    from crackseg.prediction.options import PredictOptions
    from crackseg.prediction.outputs import Records


@dataclass
class Plan:
    """The run decided before any work: photos (key, path, output name), open rasters, spec, outputs, the store's uploader."""

    folder: PredictionsFolder
    staged: StagedFolder  # where the folder lies: --out itself, or staged for a store
    photos: list[tuple[int, Path | RemoteFile, str]]
    rasters: list[Raster]
    spec: OutputSpec
    outputs: dict[int, list[Path]]  # every input's files, its mask first
    warnings: list[str]
    skip_existing: bool = False

    def marked(self, made_with: str) -> Plan:
        """This plan with every photo's mask saying ``made_with`` (:attr:`OutputSpec.made_with`; a raster's mask says
        what its :class:`RasterRun` says, which is made from this)."""
        return replace(self, spec=replace(self.spec, made_with=made_with))

    def refuse_masks_made_otherwise(self) -> None:
        """Before any work under ``--skip-existing``: the first mask kept must have been made as this run makes masks
        (the same model, threshold and tiling), else the folder would mix masks of two settings under one summary."""
        key = next((key for key in self.outputs if self.kept(key)), None)
        if key is None:
            return
        differs = self._made_otherwise(self.outputs[key][0])
        if differs:
            raise InputError(f"{self.staged.shown(self.outputs[key][0])}: an earlier run made it with {differs}; --skip-existing "
                             "would keep its masks beside this run's: give that run's model and flags to finish it, or pass "
                             "--overwrite to predict every input again")

    def _made_otherwise(self, mask: Path) -> str | None:
        """How an earlier run made ``mask`` otherwise than this run makes masks ("threshold 0.95, not 0.05"); None when
        alike, or when the mask does not say (written before masks said what made them)."""
        saved = saved_made_with(mask)
        if saved is None or saved == self.spec.made_with:
            return None
        try:
            then = json.loads(saved)
        except ValueError:
            then = {}
        now = json.loads(self.spec.made_with)
        differs = [f"{name} {json.dumps(then.get(name))}, not {json.dumps(value)}" for name, value in now.items() if then.get(name) != value]
        return ", ".join(differs) or "other settings"

    def kept(self, key: int, read: int = 1) -> bool:
        """Whether ``--skip-existing`` keeps an input's outputs of an earlier run: all of them in the folder, or on the
        store when this run began (the first ``read`` of them, the mask first, are then fetched, to be read as local files)."""
        return self.skip_existing and self.staged.fetch(self.outputs[key], read)

    def kept_raster(self, key: int) -> bool:
        """Whether ``--skip-existing`` keeps a raster's outputs: :meth:`kept`, and its mask readable whole, since it is
        measured from it, and made as this run makes masks (a damaged one, or one made otherwise, is said on stderr, and the
        raster predicted again)."""
        if not self.kept(key):
            return False
        raster = next(raster for raster in self.rasters if raster.key == key)
        mask = self.folder.mask(raster.name, raster=True)
        reason = unreadable_raster(mask)
        differs = self._made_otherwise(mask) if reason is None else None
        if differs:
            tqdm.write(f"crackseg: warning: {self.staged.shown(mask)}: an earlier run made it with {differs}; "
                       f"predicting {raster.path} again", file=sys.stderr)
            return False
        if reason is not None:
            tqdm.write(f"crackseg: warning: {self.staged.shown(mask)}: the mask an earlier run wrote is not readable "
                       f"({reason}); predicting {raster.path} again", file=sys.stderr)
        return reason is None

    def kept_rows(self, key: int, path: Path | RemoteFile, name: str, threshold: float) -> tuple[dict, list[dict]] | None:
        """The table rows of a photo whose outputs ``--skip-existing`` keeps, read from its saved mask (and probabilities,
        for the uncertainty at ``threshold``); None when it is to be predicted: not kept, or its saved mask is damaged or
        was made otherwise than this run makes masks (said on stderr, and its outputs are written anew)."""
        if not self.kept(key, 2 if self.spec.save_prob else 1):
            return None
        differs = self._made_otherwise(self.folder.mask(name))
        if differs:
            tqdm.write(f"crackseg: warning: {self.staged.shown(self.folder.mask(name))}: an earlier run made it with {differs}; "
                       f"predicting {path} again", file=sys.stderr)
            return None
        unsure = {}
        if self.spec.save_prob:
            probs = self.folder.probabilities(name)
            unsure = self._read_kept(probs, "probability map", path, lambda: uncertainty(read_probability(probs).numpy(), threshold))
            if unsure is None:
                return None
        mask = self.folder.mask(name)
        return self._read_kept(mask, "mask", path, lambda: summarize_existing(path, mask, self.spec, unsure))

    def _read_kept(self, saved: Path, kind: str, path: Path | RemoteFile, read):
        """``read()`` of a file an earlier run wrote; None when it is not readable (said on stderr: ``path`` is then
        predicted again)."""
        try:
            return read()
        except (*DECODE_ERRORS, InputError) as error:
            reason = describe_error(error) if isinstance(error, DECODE_ERRORS) else str(error)
            tqdm.write(f"crackseg: warning: {self.staged.shown(saved)}: the {kind} an earlier run wrote is not readable "
                       f"({reason}); predicting {path} again", file=sys.stderr)
            return None

    def upload(self, key: int) -> None:
        """For an --out in object storage: upload an input's files, each whole, as soon as all are written."""
        self.staged.upload(self.outputs[key])

    def write_error(self, error: OSError | StorageError) -> str:
        """What errors.csv says of an input whose outputs could not be written or uploaded; raises :class:`OutFailed`
        when no later input's could be either (a store gone, a full disk)."""
        if isinstance(error, OutFailed):
            raise error
        if isinstance(error, OSError):
            self.staged.check_room(error)
        return f"cannot write outputs: {error}"

    def unfinished(self, error: OutFailed) -> InputError:
        """The error of a run whose --out took no more files: which inputs' outputs it lacks, and how to finish them."""
        names = [str(path) for key, path, _ in (*self.photos, *((r.key, r.path, r.name) for r in self.rasters))
                 if not self.staged.stored(self.outputs[key])]
        listed = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
        lacking = f"the outputs of {len(names)} of {len(self.outputs)} inputs ({listed}) and " if names else ""
        return InputError(f"{error}: {self.staged.shown()} lacks {lacking}the tables; rerun with --skip-existing to finish "
                          "exactly those")


@dataclass(frozen=True)
class Job:
    """One planned run: what to predict (``plan``), with which model, into which ``records``."""

    plan: Plan
    run: RasterRun  # the rasters' settings, with the predictor and threshold the photos use too
    choice: RuntimeChoice
    options: PredictOptions
    env: distributed.Environment
    records: Records

    @property
    def predictor(self) -> Predictor:
        return self.run.predictor


@dataclass(frozen=True)
class Work:
    """One item of the work list: a photo, or one band of a raster's tile rows."""

    key: int  # the input's row in predictions.csv
    path: Path | RemoteFile
    name: str  # the output name
    band: tuple[int, int] | None = None  # a raster's (index, count) of bands; None: a photo, decoded whole


def work_list(plan: Plan, bands: int) -> list[Work]:
    """Every photo, then each raster as ``bands`` bands of its tile rows (bands with no rows of their own are empty)."""
    photos = [Work(key, path, name) for key, path, name in plan.photos]
    return photos + [Work(raster.key, raster.path, raster.name, (index, bands)) for raster in plan.rasters for index in range(bands)]


def share(work: list[Work], rank: int, world_size: int) -> list[Work]:
    """Process ``rank``'s items of a list made with ``bands=world_size``: every ``world_size``-th photo, from the
    ``rank``-th, and band ``rank`` of every raster."""
    photos = [item for item in work if item.band is None]
    return photos[rank::world_size] + [item for item in work if item.band is not None and item.band[0] == rank]
