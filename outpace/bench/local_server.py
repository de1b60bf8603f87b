"""``python -m outpace serve ARGS`` in a child process on 127.0.0.1 and a free port, for benches and tests.

Its output goes to a log file (a temporary one, removed by ``close``, unless ``log_path`` names one).
Ready once /health answers 200; a server that exits or is not ready in time raises with its log's
tail. The free port is found before the server binds it, so another process (a test beside this one, another
server) may take it in between: a server that exits because its address is in use is started again on another
port, up to ``PORT_TRIES`` times in all. ``terminate`` sends SIGTERM (the server finishes in-flight requests and exits 0: server/app.py
``run_server``) and kills it if it outlives the timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from outpace.distributed.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
PORT_TRIES = 5


class LocalServer:
    def __init__(
        self, *args: str, env: dict[str, str] | None = None, log_path: str | Path | None = None
    ) -> None:
        self.args = list(args)
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="outpace-serve-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self._env = dict(os.environ, **(env or {}))
        self._env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
        )
        self.port_tries = 0
        self._start()

    def _start(self) -> None:
        """The server on a port free now (its log begun again)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.port_tries += 1
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "outpace",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *self.args,
                ],
                cwd=ROOT,
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 180.0) -> LocalServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._lost_its_port() and self.port_tries < PORT_TRIES:
                self._start()
                continue
            self.check_alive()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"the server was not ready after {timeout} s; its log ends:\n{self.tail()}"
        )

    def _lost_its_port(self) -> bool:
        """Whether the server exited because another process took its port first (cli/serve.py's check
        before the model loads, or uvicorn's bind after it)."""
        return self.proc.poll() is not None and "address already in use" in self.tail().lower()

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with {self.proc.returncode}; its log ends:\n{self.tail()}"
            )

    def output(self) -> str:
        return self.log_path.read_text()

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]

    def terminate(self, timeout: float = 60.0) -> int:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` seconds); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.terminate()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
