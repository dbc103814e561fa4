"""Process-group plumbing for torchrun: the environment, the device and its precision, collectives.

Without torchrun's variables everything runs as one process and the collectives here
are no-ops. Collectives never assume CUDA: gloo on CPU runs the same code in tests.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from crackseg.core.errors import InputError, RunError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
# How long a process waits for the others in one collective. NCCL's own 10 minutes ended runs that were not stuck:
# a prediction process whose share is done waits for the one still on a large ortho, the others for rank 0's samples
# and checkpoints. A process that dies is caught sooner anyway: torchrun stops its group at once.
COLLECTIVE_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class Environment:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto") -> Environment:
    """Join the process group torchrun describes (RANK, LOCAL_RANK, WORLD_SIZE), if any.

    The device comes from LOCAL_RANK, never RANK, so the second machine uses its own GPUs.
    """
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size > 1 and re.fullmatch(r"cuda:\d+", device.strip()):
        raise InputError(f"--device {device}: with {world_size} processes each takes the GPU of its local rank; give --device "
                         "cuda (or auto), and choose the GPUs with CUDA_VISIBLE_DEVICES")
    chosen = select_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = dist.get_default_backend_for_device(chosen)
        dist.init_process_group(
            backend, store=_restart_safe_store(), rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT,
            device_id=chosen if chosen.type == "cuda" else None,
        )
    return Environment(rank, local_rank, world_size, chosen)


def select_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto``: this process's GPU (by ``local_rank``) when CUDA is present, else the CPU.

    ``cpu``, ``cuda`` and ``cuda:N`` are the other names; a GPU that is not there is an InputError.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        chosen = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {name}: unknown device; use auto, cpu, cuda or cuda:N") from None
    if chosen.type not in ("cpu", "cuda"):
        raise InputError(f"--device {name}: crackseg runs on cpu or cuda; use auto, cpu, cuda or cuda:N")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {name}: no CUDA GPU is visible to this process; use --device cpu")
    if chosen.type == "cuda":
        index = local_rank if chosen.index is None else chosen.index
        if index >= torch.cuda.device_count():
            raise InputError(f"--device {name}: GPU {index} does not exist ({torch.cuda.device_count()} visible)")
        chosen = torch.device("cuda", index)
        torch.cuda.set_device(chosen)
    return chosen


def resolve_amp(name: str, device: torch.device, training: bool = False) -> torch.dtype | None:
    """The autocast dtype for ``--amp`` (auto, bf16, fp16, off) on ``device``; None means float32.

    ``auto`` is bf16 on GPUs that support it (no GradScaler needed), and for training on CPUs that
    compute bf16 in hardware (the CPU recipe of docs/results.md: as accurate, about twice as fast);
    else float32. Prediction on a CPU stays float32, whose probabilities exported models match.
    """
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        return torch.bfloat16 if training and device.type == "cpu" and cpu_has_native_bf16() else None
    if name not in AMP_DTYPES:
        raise InputError(f"--amp must be one of auto, {', '.join(AMP_DTYPES)}, got {name!r}")
    if name == "fp16" and device.type == "cpu":
        raise InputError("--amp fp16 needs a GPU; use --amp bf16 or off on CPU")
    return AMP_DTYPES[name]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware: the flags Linux lists in /proc/cpuinfo for x86's
    AVX512-BF16 or AMX-BF16 and Arm's BF16. Elsewhere bf16 is emulated, slower than float32."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def check_device_options(env: Environment, strategy: str, sync_bn: bool, amp: str) -> None:
    """Refuse training options this process's device and launch cannot honour, before any work starts."""
    if strategy == "dp" and env.distributed:
        raise InputError("--strategy dp runs as one process driving every GPU; start it with crackseg train, not torchrun")
    if sync_bn and env.device.type != "cuda":
        raise InputError("--sync-bn needs CUDA devices (SyncBatchNorm has no CPU implementation)")
    if sync_bn and strategy == "dp":
        raise InputError("--sync-bn synchronizes BatchNorm across torchrun processes; --strategy dp cannot, "
                         "so start the run with launch.sh (torchrun, DDP) instead")
    resolve_amp(amp, env.device)


def amp_name(dtype: torch.dtype | None) -> str:
    """The ``--amp`` name of an autocast dtype, as run folders record it."""
    return next(name for name, value in AMP_DTYPES.items() if value == dtype)


def spare_cores() -> int:
    """Loader processes for one process: this machine's cores shared among torchrun's local processes, less the process's own (1 to 8)."""
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return min(8, max(1, (os.cpu_count() or 1) // per_machine - 1))


def _restart_safe_store() -> dist.Store | None:
    """A store whose keys are fresh for every torchrun restart attempt (None: torch's default).

    torchrun's agent keeps serving one store at MASTER_ADDR:MASTER_PORT across restarts,
    and torch 2.14 reuses its keys: the restarted ranks read the addresses of the killed
    ones and gloo fails with "connectFullMesh ... Connection refused", so --max-restarts
    never recovers. Prefixing the keys with the restart count gives each attempt its own.
    That serves plain ``torchrun`` on one machine, where one agent counts the restarts;
    across machines the agents' counts can differ, so ``launch.sh`` turns the shared store
    off instead (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) and this function is not used.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    agent_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(minutes=30)
    )
    return dist.PrefixStore(f"crackseg/attempt{attempt}", agent_store)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all processes, in place; returns it."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_min(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Give every process rank 0's buffers (BatchNorm running statistics).

    DDP copies buffers from rank 0 at the start of each training forward, so after the
    last step the other ranks still hold their own statistics; without this, each rank
    would validate a slightly different model from the one rank 0 saves.
    """
    if dist.is_initialized():
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def barrier() -> None:
    """Wait until every process gets here (nothing to wait for alone)."""
    if dist.is_initialized():
        dist.barrier()


def broadcast_from_main(value):
    """Rank 0's ``value`` on every process (any picklable object): decisions made once."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def decided_on_main(env: Environment, decide, *args):
    """Run ``decide(*args)`` on rank 0 and hand its result, or its InputError / RunError, to every rank.

    Raising on rank 0 alone would leave the other ranks waiting in a collective forever.
    """
    outcome = None
    if env.is_main:
        try:
            outcome = ("ok", decide(*args))
        except (InputError, RunError) as error:
            outcome = (RunError if isinstance(error, RunError) else InputError, str(error))  # subclasses take other arguments
    outcome = broadcast_from_main(outcome)
    if outcome[0] != "ok":
        raise outcome[0](outcome[1])
    return outcome[1]


def gather_objects(part, env: Environment) -> list:
    """Every process's ``part`` (any picklable object), in rank order, on every process."""
    if not env.distributed:
        return [part]
    parts = [None] * env.world_size
    dist.all_gather_object(parts, part)
    return parts
