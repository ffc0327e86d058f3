"""Fixtures: a job's servers as real `hetps server` processes on 127.0.0.1.

`servers(yaml_text)` writes the config, starts one process per server rank
with free ports, waits until each prints its HETPS_LISTENING line, and
returns a Job (config path, endpoints, overrides for workers). Every process
is stopped when the test ends. Workers of a test run in this process, on
threads when there are several (their registration waits at the start
barrier for all of them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
HETPS = os.environ.get("HETPS_BINARY", str(ROOT / "build" / "hetps"))
# Bound on a server's start-up, and on any worker thread of a test.
START_TIMEOUT_S = 60
THREAD_TIMEOUT_S = 120


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class Job:
    config: str
    endpoints: list[str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    # cluster.rendezvous: workers are told only server 0's address.
    rendezvous: str = ""

    @property
    def overrides(self) -> list[str]:
        if self.rendezvous:
            return ["cluster.rendezvous=" + self.rendezvous]
        return ["cluster.ps_endpoints=" + ",".join(self.endpoints)]

    def worker(self, rank: int, **kwargs):
        import hetps
        return hetps.Worker(self.config, rank, self.overrides, **kwargs)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)


def start_servers(tmp_path: Path, yaml_text: str, servers: int,
                  rendezvous: bool = False) -> Job:
    """With `rendezvous`, server 0 listens at a free port that is the
    rendezvous and the others register there; `endpoints` are then what
    each server announced."""
    config = tmp_path / "job.yaml"
    config.write_text(yaml_text)
    endpoints = [f"127.0.0.1:{p}" for p in free_ports(servers)]
    job = Job(str(config), endpoints,
              rendezvous=endpoints[0] if rendezvous else "")
    for rank in range(servers):
        log = open(tmp_path / f"server-{rank}.log", "w+")
        job.procs.append(subprocess.Popen(
            [HETPS, "server", "--config", str(config), "--rank", str(rank),
             "--set", job.overrides[0]],
            stdout=subprocess.PIPE, stderr=log, text=True))
    deadline = time.monotonic() + START_TIMEOUT_S
    for rank, proc in enumerate(job.procs):
        # A server prints HETPS_LISTENING once it accepts calls.
        while True:
            line = proc.stdout.readline()
            if line.startswith("HETPS_LISTENING"):
                job.endpoints[rank] = line.split()[1]
                break
            if not line or time.monotonic() > deadline:
                stop(job)
                log = (tmp_path / f"server-{rank}.log").read_text()
                raise RuntimeError(f"server {rank} did not start:\n{log}")
    return job


def stop(job: Job) -> None:
    for p in job.procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in job.procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def servers(tmp_path):
    jobs: list[Job] = []

    def start(yaml_text: str, count: int = 2, rendezvous: bool = False) -> Job:
        jobs.append(start_servers(tmp_path, yaml_text, count, rendezvous))
        return jobs[-1]

    yield start
    for job in jobs:
        stop(job)


def run_threads(fns: list[Callable[[], object]]) -> list[object]:
    """Runs each function on its own thread; returns their results, raising
    the first exception. Bounded by THREAD_TIMEOUT_S."""
    results: list[object] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True)
               for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(THREAD_TIMEOUT_S)
        if t.is_alive():
            raise TimeoutError(f"a worker thread ran past {THREAD_TIMEOUT_S} s")
    if errors:
        raise errors[0]
    return results
