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


class Relay:
    """A TCP relay on a free port of 127.0.0.1 to ``target`` (host:port), in threads of this process: :meth:`cut` makes
    the service behind it die as a crashed server does (open connections reset, new ones refused), :meth:`restore`
    brings it back on the same port. ``cut_at``: cut when a client sends these bytes (a request for one object), before
    the server sees them."""

    def __init__(self, target: str, cut_at: bytes | None = None):
        import threading

        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._cut_at = cut_at
        self.port = free_port()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._open = self._open, []
        listener.close()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
                connection.close()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._open += [client, server]
            for source, sink, watched in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(source, sink, watched), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, watched: bool) -> None:
        try:
            while data := source.recv(65536):
                if watched and self._cut_at and self._cut_at in data:
                    self._cut_at = None
                    self.cut()
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
