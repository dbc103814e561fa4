"""Plumbing that only shows under torchrun: restarts of a gloo job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    from crackseg import distributed

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
