"""Where predict's work runs, one table read by ``--engine``'s choices and by :func:`crackseg.prediction.predict.predict_folder`.

An engine takes the planned run (:class:`crackseg.prediction.work.Job`) and fills its records; the driver writes the tables after. Each entry
imports its implementation only when chosen, so the table costs nothing to read (no torch, no Ray).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    import torch

    from crackseg.model import distributed
    from crackseg.prediction.work import Job


class Engine(Protocol):
    def check(self, env: distributed.Environment) -> None:
        """Refuse, before any work, a run this engine cannot do (an InputError)."""

    def model_device(self, env: distributed.Environment) -> torch.device:
        """Where this process loads the model."""

    def run(self, job: Job) -> None:
        """Predict every item of ``job.plan`` this process owns into ``job.records``."""


@dataclass(frozen=True)
class EngineEntry:
    help: str
    load: Callable[[], Engine]


def _local() -> Engine:
    from crackseg.prediction.local_engine import LocalEngine

    return LocalEngine()


def _ray() -> Engine:
    from crackseg.prediction.ray_engine import RayEngine

    return RayEngine()


ENGINES = {
    "local": EngineEntry("this process (or torchrun's processes, see launch.sh)", _local),
    "ray": EngineEntry("a pool of Ray actors, one model each, on --ray-address (pip install 'crackseg[ray]'; docs/scale.md)", _ray),
}
