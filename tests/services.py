"""Real services on this machine for the suite and the benchmarks: moto's S3 server on loopback, and a Ray head.

Each runs in subprocesses of its own (moto in the test process stalls GDAL's writes) and is stopped when its context
ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """``python -m moto.server`` on a free port of 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start on {endpoint}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


@contextlib.contextmanager
def ray_head(env: dict[str, str], cpus: int, log: Path) -> Iterator[str]:
    """``ray start --head`` with ``cpus`` CPUs on a free port, in the environment ``env`` (its nodes' settings: a
    RAY_AUTH_TOKEN, the store's AWS variables); yields its address once ``ray status`` answers."""
    ray = str(Path(sys.executable).parent / "ray")
    address = f"127.0.0.1:{free_port()}"
    with open(log, "w") as output:
        head = subprocess.Popen([ray, "start", "--head", "--block", "--num-cpus", str(cpus), "--port", address.split(":")[1],
                                 "--include-dashboard=false", "--disable-usage-stats"],
                                env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while subprocess.run([ray, "status", "--address", address], env=env, capture_output=True).returncode != 0:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray head did not start on {address}: {log.read_text()[-2000:]}")
                time.sleep(1)
            yield address
        finally:
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(1)
            except subprocess.TimeoutExpired:  # it stops its processes one by one, for seconds; nothing needs them to
                os.killpg(head.pid, signal.SIGKILL)  # end cleanly
                head.wait(30)
