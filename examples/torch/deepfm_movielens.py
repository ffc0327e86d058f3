"""DeepFM in PyTorch with its embedding rows on hetps servers.

A worker of `hetps launch examples/torch/deepfm_movielens.yaml` (the launcher
starts one process per rank and passes the job through the environment):

    PYTHONPATH=build/python build/hetps launch examples/torch/deepfm_movielens.yaml

The model: each slot's rows (1 + k floats: a first-order weight and a k-dim
vector; a multi-valued slot such as genres averages its rows) come from the
sparse table `emb`; the FM term and an MLP over the slot vectors run in
torch; the MLP and the global bias live on the dense table `dense`. The
job's mode (semi_async here) governs both tables; the batches and chunks
come from the coordinator, sized to each worker's measured speed.

--device cuda puts the dense part on the GPU (the rows stay on the CPU).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import hetps
import hetps.torch as ht


class DeepFM(torch.nn.Module):
    def __init__(self, embedding: torch.nn.Module, num_slots: int,
                 num_dense: int, k: int, hidden: list[int]) -> None:
        super().__init__()
        self.embedding = embedding
        self.num_slots, self.k = num_slots, k
        layers, width = [], num_slots * k + num_dense
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        # The output layer has no bias of its own: `bias` is the model's.
        layers.append(torch.nn.Linear(width, 1, bias=False))
        self.mlp = torch.nn.Sequential(*layers)
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, batch: hetps.Batch) -> torch.Tensor:
        n = len(batch)
        ids = torch.from_numpy(batch.keys.view(np.int64))
        offsets = torch.from_numpy(batch.offsets[:-1].astype(np.int64))
        rows = self.embedding(ids, offsets).view(n, self.num_slots, 1 + self.k)
        first = rows[..., 0].sum(1)
        v = rows[..., 1:]
        fm = 0.5 * (v.sum(1).square() - v.square().sum(1)).sum(1)
        x = v.reshape(n, self.num_slots * self.k)
        if batch.num_dense:
            x = torch.cat([x, torch.from_numpy(np.array(batch.dense)).to(x)], 1)
        deep = self.mlp(x).squeeze(1)
        return self.bias + first + fm + deep


def dense_size(num_slots: int, num_dense: int, k: int,
               hidden: list[int]) -> int:
    """The dense table's dim for this model (the MLP and the bias)."""
    size, width = 1, num_slots * k + num_dense
    for h in hidden:
        size += width * h + h
        width = h
    return size + width


def train(worker: hetps.Worker, k: int, hidden: list[int],
          device: str) -> dict:
    emb = ht.EmbeddingBag(worker, "emb", mode="mean")
    model = DeepFM(emb, worker.num_slots, worker.num_dense, k, hidden)
    ps = ht.PsModel(worker, model, dense_table="dense", device=device)

    def predict(batch: hetps.Batch) -> np.ndarray:
        with torch.no_grad():
            ps.pull()
            return torch.sigmoid(model(batch)).cpu().numpy()

    def evaluate(epoch: int) -> None:
        model.eval()
        auc, logloss = worker.evaluate(predict)
        worker.record_eval(auc, logloss, epoch)
        model.train()
        print(f"epoch {epoch}: test AUC {auc:.4f} logloss {logloss:.4f}"
              if epoch >= 0 else f"test AUC {auc:.4f} logloss {logloss:.4f}",
              flush=True)

    # Rank 0 evaluates each epoch as its chunks move on, and every
    # train.eval_every_s seconds if set (AUC over time, for benchmarks).
    every_s = worker.train_config["eval_every_s"] if worker.rank == 0 else 0
    last_eval = time.monotonic()
    epoch = 0
    for batch in worker.batches():
        if batch.epoch > epoch and worker.rank == 0:
            evaluate(batch.epoch)
        epoch = batch.epoch
        if every_s > 0 and time.monotonic() - last_eval >= every_s:
            evaluate(-1)
            last_eval = time.monotonic()
        ps.pull()
        labels = torch.from_numpy(np.array(batch.labels)).to(device)
        loss = F.binary_cross_entropy_with_logits(model(batch), labels)
        loss.backward()
        ps.push(len(batch), loss=loss.item())
    ps.flush()
    model.eval()
    return worker.finish(evaluate=predict)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=16,
                        help="embedding width (the table's dim is k + 1)")
    parser.add_argument("--hidden", type=int, nargs="*", default=[32])
    parser.add_argument("--device", default="cpu",
                        help="where the dense part runs: cpu or cuda")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per worker")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with hetps.Worker.from_env() as worker:
        report = train(worker, args.k, args.hidden, args.device)
    if "test_auc" in report:
        print(f"final model: test AUC {report['test_auc']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
