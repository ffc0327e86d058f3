"""hetps.torch against plain PyTorch: a model whose embedding rows live on
hetps (sync, one worker, server-side SGD) ends with the same parameters as
the same model trained locally with torch.optim.SGD on the same batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hetps
import hetps.torch as ht
from test_worker import job_yaml

FIELDS, DIM, LR = 8, 4, 0.5
DENSE = FIELDS * DIM + 1  # the Linear layer's weight and bias

TABLES = f"""
tables:
  - {{name: emb, kind: sparse, dim: {DIM},
     init: {{type: uniform, scale: 0.1}},
     optimizer: {{type: sgd, learning_rate: {LR}}}}}
  - {{name: dense, kind: dense, dim: {DENSE},
     init: {{type: uniform, scale: 0.1}},
     optimizer: {{type: sgd, learning_rate: {LR}}}}}
"""


def yaml_text() -> str:
    return f"""
name: torch-test
mode: sync
cluster: {{servers: 2, workers: 1}}
train:
  model: none
  warmup_rounds: 0  # the tests check exact steps
  epochs: 1
  data: {{format: synthetic, fields: {FIELDS}, train_samples: 960,
          test_samples: 100, ids_per_field: 50}}
log_level: warn
{TABLES}
"""


class Net(torch.nn.Module):
    """Embeddings of the 8 fields, concatenated, then a logistic layer."""

    def __init__(self, embedding: torch.nn.Module, bag: bool) -> None:
        super().__init__()
        self.embedding = embedding
        self.bag = bag
        self.linear = torch.nn.Linear(FIELDS * DIM, 1)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor,
                n: int) -> torch.Tensor:
        if self.bag:
            e = self.embedding(ids, offsets)          # (n * FIELDS, DIM)
        else:
            e = self.embedding(ids.view(n, FIELDS))   # (n, FIELDS, DIM)
        return self.linear(e.reshape(n, FIELDS * DIM)).squeeze(1)


@pytest.mark.parametrize("bag", [False, True],
                         ids=["Embedding", "EmbeddingBag"])
def test_torch_embedding_matches_local_sgd(servers, bag):
    job = servers(yaml_text())
    w = job.worker(0, batch_size=32)
    emb = ht.EmbeddingBag(w, "emb", mode="sum") if bag else \
        ht.Embedding(w, "emb")
    net = Net(emb, bag)
    ps = ht.PsModel(w, net, dense_table="dense")
    ps.pull()
    start_dense = w.pull_dense("dense")

    # The local model: the same linear layer, and a plain table of the rows
    # seen so far, started from the values hetps starts them from.
    local_linear = torch.nn.Linear(FIELDS * DIM, 1)
    local_linear.load_state_dict(net.linear.state_dict())
    local_rows: dict[int, np.ndarray] = {}
    steps = 0
    for batch in w.batches():
        n = len(batch)
        ids = torch.from_numpy(batch.keys.view(np.int64))
        offsets = torch.from_numpy(batch.offsets[:-1].astype(np.int64))
        labels = torch.from_numpy(np.array(batch.labels))
        new = [k for k in np.unique(batch.keys) if int(k) not in local_rows]
        if new:
            start = w.pull_sparse("emb", np.array(new, np.uint64))
            local_rows.update({int(k): r for k, r in zip(new, start)})

        # hetps: rows pulled in forward, pushed after backward.
        ps.pull()
        loss = F.binary_cross_entropy_with_logits(net(ids, offsets, n), labels)
        loss.backward()
        assert ps.push(n, loss=loss.item())

        # Local: nn.Embedding / nn.EmbeddingBag over the batch's rows, SGD.
        keys, inverse = np.unique(batch.keys, return_inverse=True)
        table = torch.nn.Parameter(torch.from_numpy(
            np.stack([local_rows[int(k)] for k in keys])))
        inv = torch.from_numpy(inverse.astype(np.int64))
        if bag:
            local_emb = torch.nn.EmbeddingBag.from_pretrained(
                table, freeze=False, mode="sum")
            e = local_emb(inv, offsets)
        else:
            local_emb = torch.nn.Embedding.from_pretrained(table, freeze=False)
            e = local_emb(inv.view(n, FIELDS))
        logits = local_linear(e.reshape(n, FIELDS * DIM)).squeeze(1)
        local_loss = F.binary_cross_entropy_with_logits(logits, labels)
        opt = torch.optim.SGD([local_emb.weight, *local_linear.parameters()],
                              lr=LR)
        opt.zero_grad()
        local_loss.backward()
        opt.step()
        for k, row in zip(keys, local_emb.weight.detach().numpy()):
            local_rows[int(k)] = row.copy()
        assert abs(loss.item() - local_loss.item()) < 1e-5
        steps += 1

    report = w.finish()
    assert report["pushes"] == steps and report["samples"] == 960
    assert report["last_loss"] > 0  # from the losses passed to push()
    keys = np.array(sorted(local_rows), np.uint64)
    served = w.pull_sparse("emb", keys)
    want = np.stack([local_rows[int(k)] for k in keys])
    assert np.abs(served - want).max() < 1e-6
    dense = w.pull_dense("dense")
    local_dense = torch.cat([p.detach().reshape(-1)
                             for p in local_linear.parameters()]).numpy()
    assert np.abs(dense - local_dense).max() < 1e-6
    # Training moved the parameters: the comparison is not of the start.
    assert np.abs(dense - start_dense).max() > 1e-3
    assert len(local_rows) > 100


def test_dense_table_of_the_wrong_size_says_the_size(servers):
    job = servers(yaml_text())
    w = job.worker(0)
    net = Net(ht.Embedding(w, "emb"), bag=False)
    net.linear = torch.nn.Linear(FIELDS * DIM, 2)
    with pytest.raises(hetps.InvalidArgumentError, match="set its dim to 66"):
        ht.PsModel(w, net, dense_table="dense")
    with pytest.raises(TypeError, match="int64"):
        net.embedding(torch.zeros(3, dtype=torch.int32))
    w.finish()


def test_push_freq_accumulates_a_sample_weighted_mean(servers):
    job = servers(yaml_text().replace("mode: sync", "mode: async"))
    w = job.worker(0, push_freq=2)
    emb = ht.Embedding(w, "emb")
    ps = ht.PsModel(w, torch.nn.Sequential(emb), dense_table=None)
    key = torch.tensor([7])
    before = w.pull_sparse("emb", np.array([7], np.uint64))[0]
    # Batch 1 (1 sample): gradient 1 per column; batch 2 (3 samples): 5.
    for samples, g in ((1, 1.0), (3, 5.0)):
        (emb(key) * g).sum().backward()
        pushed = ps.push(samples)
    assert pushed  # the second batch completed push_freq = 2
    after = w.pull_sparse("emb", np.array([7], np.uint64))[0]
    # One push of (1 * 1 + 3 * 5) / 4 = 4, at learning rate 0.5.
    np.testing.assert_allclose(before - after, np.full(DIM, 2.0), atol=1e-6)
    assert w.report()["pushes"] == 1
    w.finish()
