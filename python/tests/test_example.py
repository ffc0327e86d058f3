"""The torch DeepFM example (examples/torch/) as the README runs it: 4 Python
workers in semi_async on an emulated mixed cluster reach the built-in
model's AUC bar on MovieLens, and the fast workers train more of the data."""

from __future__ import annotations

import json
import subprocess

from conftest import HETPS, ROOT


def test_torch_deepfm_on_movielens_reaches_the_bar(tmp_path):
    summary = tmp_path / "summary.json"
    out = subprocess.run(
        [HETPS, "launch", "examples/torch/deepfm_movielens.yaml",
         "--no-status", "--run-dir", str(tmp_path / "run"),
         "--summary-json", str(summary)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["mode"] == "semi_async" and s["workers"] == 4
    assert s["emulated"] and s["failed_workers"] == []
    assert s["test_auc"] >= 0.79, s["test_auc"]
    # Every train sample once (one epoch of the 90% train split).
    assert s["finished_samples"] == s["samples"]
    assert 88000 < s["samples"] < 93000
    samples = {w["rank"]: w["samples"] for w in s["per_worker"]}
    # Ranks 0 and 1 emulate machines three times as fast as 2 and 3.
    assert min(samples[0], samples[1]) > 2 * max(samples[2], samples[3])
