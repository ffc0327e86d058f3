"""A main job (examples/main-job.yaml) started by `hetps launch` for the
metrics and dashboard tests: started in its own process group, its run
directory in a temporary folder, the coordinator's HTTP address read from
server 0's log. Used as a context manager: on leaving, the job is stopped
and its folder removed; when leaving on a failure, the tails of the
launcher's output and of every role's log are printed first, so that a
failure on CI says what the job did."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read()


def wait_for(what: str, check, timeout_s: float, every_s: float = 0.2):
    """Polls check() until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"FAIL: timed out after {timeout_s:.0f} s "
                             f"waiting for {what}")
        time.sleep(every_s)


class RunningJob:
    def __init__(self, hetps: str, *overrides: str):
        self.dir = Path(tempfile.mkdtemp(prefix="hetps-metrics-"))
        self.run_dir = self.dir / "run"
        args = [hetps, "launch", str(ROOT / "examples/main-job.yaml"),
                "--run-dir", str(self.run_dir)]
        for o in overrides:
            args += ["--set", o]
        self.log = open(self.dir / "launch.out", "w")
        self.proc = subprocess.Popen(args, stdout=self.log,
                                     stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self.base = wait_for("the coordinator's metrics address",
                                 self._coordinator_url, 60)
        except BaseException:
            self.close(failed=True)
            raise

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(failed=exc_type is not None)

    def _coordinator_url(self):
        if self.proc.poll() is not None:
            raise SystemExit(f"FAIL: the job exited ({self.proc.returncode}) "
                             f"before serving metrics; see {self.dir}")
        log = self.run_dir / "server-0.log"
        if not log.exists():
            return None
        m = re.search(r"metrics on (http://[0-9.]+:[0-9]+)/metrics",
                      log.read_text(errors="replace"))
        return m.group(1) if m else None

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def print_logs(self, lines: int = 30):
        """The last `lines` lines of the launcher's output and each log."""
        if not self.log.closed:
            self.log.flush()
        logs = [self.dir / "launch.out"] + sorted(self.run_dir.glob("*.log"))
        for log in logs:
            if not log.exists():
                continue
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            print(f"--- {log.name} (last {len(tail)} lines)")
            print("\n".join(tail))

    def close(self, failed: bool):
        """Stops the job (printing its logs first if `failed`) and removes
        its folder."""
        self.stop()
        if failed:
            self.print_logs()
        shutil.rmtree(self.dir, ignore_errors=True)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
