"""The Python path's cost per step against C++'s: one push and one pull of N
distinct keys of width D, from Python (hetps.Worker, numpy arrays) and from
C++ (bench/push_pull_bench, PsClient), against one `hetps server` on
127.0.0.1 in async mode. The two run alternately, `rounds` times each, so
the machine's noise hits both; the JSON gives each round's medians and the
ratio Python / C++ of the median step (push + pull) over the rounds.

  PYTHONPATH=build/python /usr/bin/python3 bench/python/push_pull_bench.py \
      [--keys 10000] [--dim 8] [--reps 50] [--rounds 5] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from conftest import start_servers, stop  # noqa: E402

import hetps  # noqa: E402


def python_round(keys_n: int, dim: int, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job = start_servers(Path(tmp), f"""
name: bench
mode: async
log_level: warn
train: {{model: none}}
cluster: {{servers: 1, workers: 1}}
tables:
  - {{name: d{dim}, kind: sparse, dim: {dim},
     optimizer: {{type: sgd, learning_rate: 0.01}}}}
""", 1)
        try:
            w = job.worker(0)
            table = f"d{dim}"
            rng = np.random.default_rng(1000)
            keys = rng.integers(0, 2**63, keys_n, dtype=np.uint64)
            grads = np.full((keys_n, dim), 0.001, np.float32)
            rows = np.empty((keys_n, dim), np.float32)
            grad = {table: (keys, grads)}
            # Warm-up: create the rows, open the connections.
            w.push(grad, 1, unique_keys=True)
            w.pull_sparse(table, keys, out=rows, unique_keys=True)
            push_ms, pull_ms = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                w.push(grad, 1, unique_keys=True)
                t1 = time.perf_counter()
                w.pull_sparse(table, keys, out=rows, unique_keys=True)
                t2 = time.perf_counter()
                push_ms.append((t1 - t0) * 1e3)
                pull_ms.append((t2 - t1) * 1e3)
            w.finish()
        finally:
            stop(job)
    return {"push_ms": statistics.median(push_ms),
            "pull_ms": statistics.median(pull_ms)}


def cpp_round(keys_n: int, dim: int, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cpp.json"
        subprocess.run(
            [str(ROOT / "build" / "bench" / "push_pull_bench"), "--topologies",
             "1x1", "--keys", str(keys_n), "--dims", str(dim), "--reps",
             str(reps), "--out", str(out)], capture_output=True, check=True)
        rows = json.loads(out.read_text())["results"]
    by_op = {r["op"]: r["median_ms"] for r in rows}
    return {"push_ms": by_op["push"], "pull_ms": by_op["pull"]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, default=10000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args()
    rounds = []
    for r in range(a.rounds):
        cpp = cpp_round(a.keys, a.dim, a.reps)
        py = python_round(a.keys, a.dim, a.reps)
        rounds.append({"cpp": cpp, "python": py})
        print(f"round {r}: C++ push {cpp['push_ms']:.3f} pull "
              f"{cpp['pull_ms']:.3f} ms; Python push {py['push_ms']:.3f} "
              f"pull {py['pull_ms']:.3f} ms", file=sys.stderr)

    def med(side: str, op: str) -> float:
        return statistics.median(r[side][op] for r in rounds)

    step = {side: med(side, "push_ms") + med(side, "pull_ms")
            for side in ("cpp", "python")}
    doc = {
        "benchmark": "python_push_pull",
        "keys": a.keys, "dim": a.dim, "reps": a.reps, "rounds": rounds,
        "median": {side: {"push_ms": med(side, "push_ms"),
                          "pull_ms": med(side, "pull_ms"),
                          "step_ms": step[side]}
                   for side in ("cpp", "python")},
        "python_over_cpp_step": step["python"] / step["cpp"],
        "python_over_cpp_push": med("python", "push_ms") / med("cpp", "push_ms"),
        "python_over_cpp_pull": med("python", "pull_ms") / med("cpp", "pull_ms"),
    }
    print(json.dumps(doc, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
