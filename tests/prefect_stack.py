"""A real Prefect server and workers on 127.0.0.1 for tests: free port, API auth on (as infra/local/start.sh),
bounded waits, stopped by PID."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectStack:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        self.auth = f"xmc:{secrets.token_urlsafe(16)}"
        self.procs: list[subprocess.Popen] = []

    def settings(self) -> dict:
        """For ``prefect.settings.temporary_settings`` in the test process."""
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

        return {PREFECT_API_URL: self.api, PREFECT_API_AUTH_STRING: self.auth}

    def env(self, **extra: str) -> dict[str, str]:
        e = dict(os.environ)
        e.update({"PREFECT_HOME": str(self.home), "PREFECT_API_URL": self.api,
                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1",
                  "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PREFECT_LOGGING_LEVEL": "INFO",
                  "PREFECT_SERVER_API_AUTH_STRING": self.auth, "PREFECT_API_AUTH_STRING": self.auth,
                  "PATH": f"{BIN}{os.pathsep}{e.get('PATH', '')}"})
        e.update(extra)
        return e

    def start_server(self, timeout: float = 90) -> None:
        log = open(self.home / "server.log", "w")
        p = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                             env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"prefect server exited: {(self.home / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.api}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError("prefect server not healthy in time")

    def cli(self, *args: str, cwd: Path | None = None, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        p = subprocess.run([str(BIN / "prefect"), *args], cwd=cwd, env=self.env(**env), capture_output=True, text=True,
                           timeout=300)
        if check and p.returncode != 0:
            raise AssertionError(f"prefect {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p

    def start_worker(self, pool: str, name: str, cwd: Path, **env: str) -> subprocess.Popen:
        log = open(self.home / f"worker-{name}.log", "w")
        # the worker asks for due runs every 2 s instead of Prefect's 10: each run a test triggers starts up to
        # 8 s sooner (a deployed worker keeps the default)
        env = {"PREFECT_WORKER_QUERY_SECONDS": "2", **env}
        p = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", pool, "--name", name, "--type", "process"],
                             cwd=cwd, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def stop_worker(self, p: subprocess.Popen, timeout: float = 30) -> None:
        """Stop one worker this stack started (by its PID: drain on the first SIGTERM, stop on the second)."""
        for _ in range(2):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=timeout / 2)
                except subprocess.TimeoutExpired:
                    pass
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def stop(self) -> None:
        # workers drain on the first SIGTERM and stop on the second
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        time.sleep(1)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
