"""Every call that waits on the servers releases the GIL."""

from __future__ import annotations

import threading

import numpy as np

from conftest import THREAD_TIMEOUT_S
from test_worker import KEYS, job_yaml


def test_a_second_thread_runs_while_a_pull_waits(servers):
    # Sync mode: worker 0's pull of round 1 waits until worker 1 has pushed.
    # Worker 1's thread first has to run a million Python steps, which it can
    # only do while the pull has let go of the GIL; so the pull returning at
    # all proves it did (without, the round never closes and the pull fails
    # after server.sync_wait_timeout_s).
    job = servers(job_yaml("sync", 2, "server: {sync_wait_timeout_s: 30}"))
    pulling = threading.Event()
    counted = []
    grads = {"emb": (KEYS, np.ones((50, 4), np.float32))}

    def worker1():
        w = job.worker(1)
        pulling.wait(THREAD_TIMEOUT_S)
        n = 0
        for _ in range(1_000_000):
            n += 1
        counted.append(n)
        w.push(grads, batch_size=1)
        w.finish()

    t = threading.Thread(target=worker1, daemon=True)
    t.start()
    w0 = job.worker(0)
    w0.push(grads, batch_size=1)
    pulling.set()
    rows = w0.pull_sparse("emb", KEYS)
    assert counted == [1_000_000]
    # The round closed with both pushes: their mean applied once.
    np.testing.assert_array_equal(rows, np.full((50, 4), -1.0, np.float32))
    w0.finish()
    t.join(THREAD_TIMEOUT_S)
    assert not t.is_alive()
