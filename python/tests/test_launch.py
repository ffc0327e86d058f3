"""`hetps launch` runs Python workers (worker.command): environment, output
prefixes, the summary from their reports, and the failure rules of C++
workers (a SIGKILLed worker leaves the live set, its chunk goes back, the
job finishes with every sample trained)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import HETPS

WORKER = Path(__file__).parent / "workers" / "lr_worker.py"
TRAIN, TEST = 4000, 1000


def launch(tmp_path: Path, mode: str, extra_env: dict) -> tuple[dict, str]:
    config = tmp_path / "job.yaml"
    config.write_text(f"""
name: py-launch
mode: {mode}
cluster: {{servers: 2, workers: 3, max_worker_failures: 1}}
worker: {{command: [{sys.executable}, {WORKER}]}}
server: {{heartbeat_timeout_s: 2}}
train:
  model: none
  epochs: 2
  batch_size: 64
  data: {{format: synthetic, fields: 8, train_samples: {TRAIN},
          test_samples: {TEST}, ids_per_field: 200}}
tables:
  - {{name: weights, kind: sparse, dim: 1, init: {{type: zero}},
     optimizer: {{type: adagrad, learning_rate: 0.1}}}}
""")
    summary = tmp_path / "summary.json"
    env = dict(os.environ, **extra_env)
    out = subprocess.run(
        [HETPS, "launch", str(config), "--no-status", "-v",
         "--run-dir", str(tmp_path / "run"), "--summary-json", str(summary)],
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(summary.read_text()), out.stdout


def test_python_workers_train_and_report(tmp_path):
    summary, stdout = launch(tmp_path, "semi_async", {})
    for rank in range(3):
        assert f"[worker {rank}] python worker {rank} of 3 (semi_async)" \
            in stdout
    assert summary["workers"] == 3 and summary["failed_workers"] == []
    assert summary["samples"] == 2 * TRAIN
    assert summary["finished_samples"] == 2 * TRAIN
    assert len(summary["per_worker"]) == 3
    assert all(w["samples"] > 0 for w in summary["per_worker"])
    # A logistic regression on the synthetic teacher's own features.
    assert summary["test_auc"] > 0.65


def test_a_python_worker_killed_is_dropped_and_the_job_finishes(tmp_path):
    summary, stdout = launch(tmp_path, "semi_async",
                             {"HETPS_TEST_KILL_RANK": "1",
                              "HETPS_TEST_KILL_AFTER": "5"})
    assert summary["failed_workers"] == [1]
    assert "worker 1 left the live set" in stdout
    # Its chunk went back to the queue and was trained by the others: no
    # sample of the two epochs was lost.
    assert summary["requeued_chunks"] >= 1
    assert summary["finished_samples"] == 2 * TRAIN
    assert summary["test_auc"] > 0.65
