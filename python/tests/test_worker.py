"""Pulls, pushes, the data feed and the status from Python workers, with
exact expected values (plain SGD with learning rate 1 from zero rows: a row
is minus the sum of what was applied to it)."""

from __future__ import annotations

import threading
import time

import numpy as np

import hetps
from conftest import THREAD_TIMEOUT_S, run_threads

TABLES = """
tables:
  - {name: emb, kind: sparse, dim: 4, init: {type: zero},
     optimizer: {type: sgd, learning_rate: 1.0}}
  - {name: w, kind: dense, dim: 10, init: {type: zero},
     optimizer: {type: sgd, learning_rate: 1.0}}
"""


def job_yaml(mode: str, workers: int, extra: str = "") -> str:
    return f"""
name: py-test
mode: {mode}
cluster: {{servers: 2, workers: {workers}}}
train:
  model: none
  warmup_rounds: 0  # the tests check exact sums of full steps
  batch_size: 8
  data: {{format: synthetic, train_samples: 960, test_samples: 100}}
log_level: warn
{TABLES}
{extra}
"""


KEYS = np.arange(1, 51, dtype=np.uint64)


def test_async_pushes_from_three_workers_sum_exactly(servers):
    job = servers(job_yaml("async", 3))

    def work(rank: int):
        w = job.worker(rank)
        assert w.rank == rank and w.num_workers == 3 and w.mode == "async"
        g = np.full((len(KEYS), 4), rank + 1, dtype=np.float32)
        # Key 7 twice in one push: the client sums the two rows.
        keys = np.append(KEYS, np.uint64(7))
        rows = np.vstack([g, np.full((1, 4), 10 * (rank + 1), np.float32)])
        dense = (rank + 1) * np.arange(10, dtype=np.float32)
        for _ in range(5):
            w.push({"emb": (keys, rows), "w": dense}, batch_size=8)
        report = w.finish()
        assert report["pushes"] == 5 and report["rank"] == rank
        return w

    workers = run_threads([lambda r=r: work(r) for r in range(3)])
    w = workers[0]
    rows = w.pull_sparse("emb", KEYS)
    assert rows.shape == (50, 4) and rows.dtype == np.float32
    # 5 pushes of (1 + 2 + 3) per worker; key 7 also 5 * (10 + 20 + 30).
    want = np.full((50, 4), -30.0, np.float32)
    want[6] -= 300.0
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(w.pull_dense("w"),
                                  -30.0 * np.arange(10, dtype=np.float32))
    # Keys never pushed start at zero; int64 keys are the same bits.
    np.testing.assert_array_equal(
        w.pull_sparse("emb", np.array([1000, -5], dtype=np.int64)),
        np.zeros((2, 4), np.float32))


def test_a_worker_finds_its_servers_at_the_rendezvous(servers):
    # issue 15: told only server 0's address (cluster.rendezvous), the
    # worker learns both servers' endpoints and trains against both.
    job = servers(job_yaml("async", 1), rendezvous=True)
    w = job.worker(0)
    assert w.endpoints == job.endpoints
    assert w.endpoints[0] == job.rendezvous and len(w.endpoints) == 2
    w.push({"emb": (KEYS, np.ones((len(KEYS), 4), np.float32)),
            "w": np.arange(10, dtype=np.float32)}, batch_size=8)
    np.testing.assert_array_equal(w.pull_sparse("emb", KEYS),
                                  np.full((len(KEYS), 4), -1.0, np.float32))
    np.testing.assert_array_equal(w.pull_dense("w"),
                                  -np.arange(10, dtype=np.float32))
    assert w.finish()["pushes"] == 1


def test_sync_rounds_apply_the_sample_weighted_mean(servers):
    job = servers(job_yaml("sync", 2))

    def work(rank: int):
        w = job.worker(rank)
        # Worker 0: gradient 4 on 1 sample; worker 1: 8 on 3 samples.
        value, samples = (4.0, 1) if rank == 0 else (8.0, 3)
        for _ in range(3):
            w.push({"emb": (KEYS, np.full((50, 4), value, np.float32))},
                   batch_size=samples)
            # A sync pull waits for the round: it sees every round so far.
            w.pull_sparse("emb", KEYS[:1])
        w.finish()
        return w

    w = run_threads([lambda r=r: work(r) for r in range(2)])[1]
    # Each round applies (1 * 4 + 3 * 8) / 4 = 7.
    np.testing.assert_array_equal(w.pull_sparse("emb", KEYS),
                                  np.full((50, 4), -21.0, np.float32))


def test_pull_unique_and_out_arrays(servers):
    job = servers(job_yaml("async", 1))
    w = job.worker(0)
    w.push({"emb": (np.array([3, 5], np.uint64),
                    np.array([[1, 1, 1, 1], [2, 2, 2, 2]], np.float32))}, 1)
    keys, rows, inverse = w.pull_unique(
        "emb", np.array([5, 3, 5, 9], np.uint64))
    np.testing.assert_array_equal(keys, [5, 3, 9])
    np.testing.assert_array_equal(inverse, [0, 1, 0, 2])
    assert inverse.dtype == np.int64
    np.testing.assert_array_equal(rows[:, 0], [-2, -1, 0])
    # `out` is filled in place and returned.
    out = np.empty((2, 4), np.float32)
    assert w.pull_sparse("emb", np.array([3, 5], np.uint64), out=out) is out
    np.testing.assert_array_equal(out[:, 3], [-1, -2])
    dense = np.empty(10, np.float32)
    assert w.pull_dense("w", out=dense) is dense
    assert w.table_dim("emb") == 4 and w.table_dim("w") == 10
    assert {t["name"]: t["dim"] for t in w.tables} == {"emb": 4, "w": 10}
    w.finish()


def test_batches_cover_the_train_split_once_per_epoch(servers):
    job = servers(job_yaml("async", 2))

    def work(rank: int):
        w = job.worker(rank, batch_size=16)
        seen = 0
        for batch in w.batches():
            n = len(batch)
            assert 0 < n <= 16
            assert batch.labels.shape == (n,)
            assert batch.offsets.shape == (n * batch.num_slots + 1,)
            assert batch.keys.shape == (batch.offsets[-1],)
            assert set(np.unique(batch.labels)) <= {0.0, 1.0}
            seen += n
        return seen, w.finish()

    (a, ra), (b, rb) = run_threads([lambda r=r: work(r) for r in range(2)])
    # Two epochs (the default) of the 960 train samples, split by chunks.
    assert a + b == 2 * 960
    assert ra["samples"] == a and rb["samples"] == b
    # 16 chunks per worker and epoch; the last ones may be cut in quarters.
    assert ra["chunks"] + rb["chunks"] >= 2 * 32


def test_get_ps_status_shows_window_throughput_and_queue(servers):
    job = servers(job_yaml("semi_async", 2))
    both_seen = threading.Barrier(2, timeout=THREAD_TIMEOUT_S)

    def work(rank: int):
        w = job.worker(rank)
        batches = w.batches()
        for _ in range(5):
            w.push({"w": np.zeros(10, np.float32)}, len(next(batches)))
        # Progress reaches the coordinator with the next heartbeat (every
        # client.heartbeat_interval_s): wait until it shows both workers.
        deadline = time.monotonic() + 30
        while True:
            st = hetps.get_ps_status(w)
            rates = st["worker_throughput"]
            if (len(rates) == 2 and all(v > 0 for v in rates.values())) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.05)
        both_seen.wait()
        for batch in batches:
            w.push({"w": np.zeros(10, np.float32)}, len(batch))
        w.finish()
        return st

    for st in run_threads([lambda r=r: work(r) for r in range(2)]):
        assert st["mode"] == "semi_async"
        assert st["window_size"] >= 2
        assert set(st["worker_throughput"]) == {"0", "1"}
        assert all(v > 0 for v in st["worker_throughput"].values())
        assert isinstance(st["grad_queue_length"], int)
        assert st["grad_queue_length"] == sum(
            s["queue_length"] for s in st["servers"])
        assert len(st["servers"]) == 2
        assert {w["rank"] for w in st["workers"]} == {0, 1}


def test_spec_style_init_ps_cluster_and_init_worker(servers):
    job = servers(job_yaml("async", 1, "compress: {codec: int8}"))
    hetps.init_ps_cluster(
        job.endpoints, workers=1, async_mode=True, window_size=0,
        grad_compress="int8",
        tables=[{"name": "emb", "kind": "sparse", "dim": 4,
                 "init": {"type": "zero"},
                 "optimizer": {"type": "sgd", "learning_rate": 1.0}},
                {"name": "w", "kind": "dense", "dim": 10,
                 "init": {"type": "zero"},
                 "optimizer": {"type": "sgd", "learning_rate": 1.0}}],
        train__model="none", log_level="warn")
    w = hetps.init_worker(batch_size=32, push_freq=3, rank=0)
    assert w.mode == "async" and w.batch_size == 32 and w.push_freq == 3
    assert w.endpoints == job.endpoints
    batch = w.next_batch()
    assert len(batch) == 32
    w.push({"w": np.full(10, 0.5, np.float32)}, len(batch))
    st = hetps.get_ps_status()  # the cluster init_ps_cluster described
    assert st["mode"] == "async" and st["workers"][0]["rank"] == 0
    # int8 (one scale per block): a constant vector comes through exactly.
    np.testing.assert_allclose(w.pull_dense("w"), np.full(10, -0.5),
                               atol=1e-6)
    report = w.finish()
    assert set(report["sent_by_codec"]) == {"int8"}


def test_from_env_reads_what_launch_sets(servers, monkeypatch):
    job = servers(job_yaml("async", 2))
    overrides = job.overrides + ["train.batch_size=16"]
    # What `hetps launch` puts in worker 1's environment.
    monkeypatch.setenv("HETPS_CONFIG", job.config)
    monkeypatch.setenv("HETPS_SET", "\n".join(overrides))
    monkeypatch.setenv("HETPS_RANK", "1")

    def worker0():
        with hetps.Worker(job.config, 0, overrides) as w:
            return w.rank, len(w.next_batch())

    def worker1():
        with hetps.Worker.from_env() as w:
            return (w.rank, len(w.next_batch()),
                    w.train_config["batch_size"], w._print_report)

    # HETPS_SET reached the worker's config (batch_size 16); its batches
    # follow the coordinator's plan, made from the servers' config (8).
    assert run_threads([worker0, worker1]) == [(0, 8), (1, 8, 16, True)]
