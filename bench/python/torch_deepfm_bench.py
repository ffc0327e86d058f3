"""PyTorch DeepFM (examples/torch/deepfm_movielens.py) through hetps against
the same model with a local embedding table: samples/s of one training
process on MovieLens, one epoch.

- hetps: one worker of a job with one `hetps server` on 127.0.0.1 (async:
  nothing waits), the rows pulled in forward and pushed after backward
  (hetps.torch.EmbeddingBag + PsModel, adagrad rows, adam dense, on the
  server).
- local: the same DeepFM over a torch.nn.EmbeddingBag holding every key of
  the data (sparse gradients; Adagrad for the rows, Adam for the rest, as
  on the server), trained on the very batches the hetps run saw, so both
  do the same work.

Both run with one torch thread, alternately, `rounds` times per batch size;
the JSON has every round and the median ratio local / hetps.

  PYTHONPATH=build/python /usr/bin/python3 bench/python/torch_deepfm_bench.py \
      [--batch-sizes 64,512] [--rounds 3] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))
sys.path.insert(0, str(ROOT / "examples" / "torch"))
from conftest import start_servers, stop  # noqa: E402
from deepfm_movielens import DeepFM, dense_size  # noqa: E402

import hetps  # noqa: E402
import hetps.torch as ht  # noqa: E402

K, HIDDEN = 16, [32]


def job_yaml(batch_size: int) -> str:
    data = ROOT / "data" / "movielens-small"
    return f"""
name: torch-bench
mode: async
log_level: warn
cluster: {{servers: 1, workers: 1}}
train:
  model: none
  epochs: 1
  batch_size: {batch_size}
  data: {{format: movielens, path: {data}, test_fraction: 0.1, split_seed: 1}}
tables:
  - {{name: emb, kind: sparse, dim: {K + 1},
     optimizer: {{type: adagrad, learning_rate: 0.1}},
     init: {{type: normal, scale: 0.01}}}}
  - {{name: dense, kind: dense, dim: {dense_size(3, 0, K, HIDDEN)},
     optimizer: {{type: adam, learning_rate: 0.001}},
     init: {{type: uniform, scale: 0.5}}}}
"""


class SavedBatch:
    """A copy of a hetps.Batch's arrays, for the local run."""

    def __init__(self, b: hetps.Batch) -> None:
        self.keys = np.array(b.keys)
        self.offsets = np.array(b.offsets)
        self.labels = np.array(b.labels)
        self.dense = np.array(b.dense)
        self.num_slots, self.num_dense = b.num_slots, b.num_dense

    def __len__(self) -> int:
        return len(self.labels)


class LocalBag(torch.nn.Module):
    """nn.EmbeddingBag over every key of the data (sorted), looked up by
    binary search."""

    def __init__(self, keys: np.ndarray, dim: int) -> None:
        super().__init__()
        self.keys = np.unique(keys)
        self.bag = torch.nn.EmbeddingBag(len(self.keys), dim, mode="mean",
                                         sparse=True)
        torch.nn.init.normal_(self.bag.weight, std=0.01)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor):
        index = np.searchsorted(self.keys, ids.numpy().view(np.uint64))
        return self.bag(torch.from_numpy(index.astype(np.int64)), offsets)


def hetps_round(batch_size: int) -> tuple[float, list[SavedBatch]]:
    with tempfile.TemporaryDirectory() as tmp:
        job = start_servers(Path(tmp), job_yaml(batch_size), 1)
        try:
            w = job.worker(0, batch_size=batch_size)
            model = DeepFM(ht.EmbeddingBag(w, "emb", mode="mean"), 3, 0, K,
                           HIDDEN)
            ps = ht.PsModel(w, model, dense_table="dense")
            saved, samples = [], 0
            start = time.perf_counter()
            for batch in w.batches():
                ps.pull()
                labels = torch.from_numpy(np.array(batch.labels))
                loss = F.binary_cross_entropy_with_logits(model(batch), labels)
                loss.backward()
                ps.push(len(batch), loss=loss.item())
                samples += len(batch)
                saved.append(SavedBatch(batch))
            seconds = time.perf_counter() - start
            w.finish()
        finally:
            stop(job)
    return samples / seconds, saved


def local_round(batches: list[SavedBatch]) -> float:
    keys = np.concatenate([b.keys for b in batches])
    model = DeepFM(LocalBag(keys, K + 1), 3, 0, K, HIDDEN)
    sparse = torch.optim.Adagrad(model.embedding.parameters(), lr=0.1)
    dense = torch.optim.Adam(
        [p for n, p in model.named_parameters()
         if not n.startswith("embedding.")], lr=0.001)
    samples = 0
    start = time.perf_counter()
    for batch in batches:
        sparse.zero_grad()
        dense.zero_grad()
        labels = torch.from_numpy(batch.labels)
        loss = F.binary_cross_entropy_with_logits(model(batch), labels)
        loss.backward()
        sparse.step()
        dense.step()
        samples += len(batch)
    return samples / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", default="64,512")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    torch.set_num_threads(1)
    results = []
    for bs in (int(x) for x in a.batch_sizes.split(",")):
        rounds = []
        for r in range(a.rounds):
            via_hetps, batches = hetps_round(bs)
            local = local_round(batches)
            rounds.append({"hetps_samples_per_s": via_hetps,
                           "local_samples_per_s": local})
            print(f"batch {bs} round {r}: hetps {via_hetps:.0f}, local "
                  f"{local:.0f} samples/s", file=sys.stderr)
        h = statistics.median(x["hetps_samples_per_s"] for x in rounds)
        loc = statistics.median(x["local_samples_per_s"] for x in rounds)
        results.append({"batch_size": bs, "rounds": rounds,
                        "hetps_samples_per_s": h, "local_samples_per_s": loc,
                        "local_over_hetps": loc / h})
    doc = {"benchmark": "torch_deepfm", "k": K, "hidden": HIDDEN,
           "torch_threads": 1, "results": results}
    print(json.dumps(doc, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
