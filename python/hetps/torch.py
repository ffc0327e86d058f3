"""PyTorch on hetps: embedding rows on the servers, the rest of the model on
a dense table, so the job's consistency mode governs the whole model.

- ``Embedding`` / ``EmbeddingBag``: like ``torch.nn.Embedding`` /
  ``EmbeddingBag``, but the weight is a sparse table of the job. ``forward``
  pulls the batch's distinct ids once; backward leaves each distinct row's
  summed gradient for the push. Ids are the job's feature keys (any 64-bit
  value; ``Batch.keys`` as int64).
- ``PsModel``: ``pull()`` loads every other parameter of the model from one
  dense table; ``push(batch_size)`` sends the gradients of every hetps
  embedding and of the dense parameters as one push per ``push_freq``
  batches, through the worker's codec and error feedback.

Sparse lookups run on the CPU (the rows come from the servers); the dense
part runs wherever its parameters live: ``PsModel(..., device="cuda")``
moves the model there and the embeddings' outputs follow (SPEC §3's
CPU-sparse / accelerator-dense split).
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from . import Worker, errors


def _keys(ids: torch.Tensor) -> np.ndarray:
    if ids.dtype != torch.int64:
        raise TypeError(f"ids: expected an int64 tensor, got {ids.dtype}")
    return ids.detach().cpu().contiguous().numpy()


class Embedding(torch.nn.Module):
    """A lookup table of ``worker``'s sparse table ``table``."""

    def __init__(self, worker: Worker, table: str,
                 device: Union[str, torch.device, None] = None) -> None:
        super().__init__()
        self.worker = worker
        self.table = table
        self.embedding_dim = worker.table_dim(table)
        self.device = torch.device(device) if device is not None else None
        # (distinct keys, their rows as a leaf tensor) of every training
        # forward since the last push.
        self._pulled: list[tuple[np.ndarray, torch.Tensor]] = []

    def _pull(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, rows, inverse = self.worker.pull_unique(self.table, _keys(ids))
        weight = torch.from_numpy(rows)
        if self.training and torch.is_grad_enabled():
            weight.requires_grad_(True)
            self._pulled.append((keys, weight))
        return weight, torch.from_numpy(inverse)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device is None else t.to(self.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        weight, inverse = self._pull(ids)
        out = weight[inverse].view(*ids.shape, self.embedding_dim)
        return self._to_device(out)

    def gradients(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(keys, row gradients) of the forwards since the last call, and
        forgets them. Rows no loss reached have no gradient and are left
        out."""
        grads = []
        for keys, weight in self._pulled:
            if weight.grad is not None:
                grads.append((keys, weight.grad.numpy()))
        self._pulled = []
        return grads


class EmbeddingBag(Embedding):
    """``torch.nn.EmbeddingBag`` over a sparse table: bags given by ``input``
    and ``offsets`` (1-D) or by the rows of a 2-D ``input``; ``mode`` sum,
    mean or max. An empty bag gives zeros."""

    def __init__(self, worker: Worker, table: str, mode: str = "sum",
                 device: Union[str, torch.device, None] = None) -> None:
        super().__init__(worker, table, device)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode: expected sum, mean or max, got {mode!r}")
        self.mode = mode

    def forward(self, input: torch.Tensor,
                offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        weight, inverse = self._pull(input.reshape(-1))
        if input.dim() == 2:
            inverse = inverse.view(input.shape)
        out = F.embedding_bag(inverse, weight, offsets, mode=self.mode,
                              per_sample_weights=per_sample_weights)
        return self._to_device(out)


class PsModel:
    """Keeps ``module``'s parameters on ``worker``'s job.

    The rows of every hetps ``Embedding``/``EmbeddingBag`` inside ``module``
    live on their sparse tables; every other parameter lives, flattened in
    ``module.parameters()`` order, on ``dense_table``, whose size must be
    their total (the error says the number). The dense parameters start
    from the table's initializer, the same on every worker: ``pull()``
    replaces torch's own initialization.

    Per step: ``pull()``, forward, ``loss.backward()``,
    ``push(batch_size)``. ``push`` accumulates ``worker.push_freq`` batches
    (weighted by their sizes) into one push; ``flush()`` sends what is left.
    """

    def __init__(self, worker: Worker, module: torch.nn.Module,
                 dense_table: Optional[str] = None,
                 device: Union[str, torch.device, None] = None) -> None:
        self.worker = worker
        self.module = module
        self.dense_table = dense_table
        self.device = torch.device(device) if device is not None else None
        self.embeddings = [m for m in module.modules()
                           if isinstance(m, Embedding)]
        if self.device is not None:
            module.to(self.device)
            for e in self.embeddings:
                e.device = self.device
        self.params = [p for p in module.parameters() if p.requires_grad]
        size = sum(p.numel() for p in self.params)
        if dense_table is None:
            if size:
                raise errors.InvalidArgumentError(
                    f"dense_table: the model has {size} dense parameters; "
                    "name the dense table that holds them")
        else:
            have = worker.table_dim(dense_table)
            if have != size:
                raise errors.InvalidArgumentError(
                    f"dense table '{dense_table}' holds {have} values, the "
                    f"model's dense parameters are {size}: set its dim to "
                    f"{size}")
        self._dense = np.empty(size, dtype=np.float32)
        self._clear()

    def _clear(self) -> None:
        # Each batch since the last push: (samples, {table: [(keys, grads)]},
        # dense gradient or None).
        self._batches: list[tuple[int, dict, Optional[np.ndarray]]] = []

    def pull(self) -> None:
        """Loads the dense parameters from the servers."""
        if self.dense_table is None:
            return
        self.worker.pull_dense(self.dense_table, out=self._dense)
        flat = torch.from_numpy(self._dense)
        with torch.no_grad():
            at = 0
            for p in self.params:
                n = p.numel()
                p.copy_(flat[at:at + n].view_as(p))
                at += n

    def _dense_grad(self) -> np.ndarray:
        out = np.zeros_like(self._dense)
        at = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                out[at:at + n] = p.grad.detach().reshape(-1).cpu().numpy()
                p.grad = None
            at += n
        return out

    def push(self, batch_size: int, loss: Optional[float] = None) -> bool:
        """Takes this batch's gradients (after ``backward``); pushes once
        ``worker.push_freq`` batches are in. ``loss``: the batch's mean loss,
        for the report and the over-compression check. True if it pushed."""
        if loss is not None:
            self.worker.record_loss(float(loss), batch_size)
        sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for e in self.embeddings:
            sparse.setdefault(e.table, []).extend(e.gradients())
        dense = self._dense_grad() if self.dense_table is not None else None
        self._batches.append((batch_size, sparse, dense))
        if len(self._batches) >= max(1, self.worker.push_freq):
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Pushes the gradients accumulated so far (if any): one batch's as
        they are, several batches' as their mean weighted by batch size."""
        if not self._batches:
            return
        samples = sum(n for n, _, _ in self._batches)
        single = len(self._batches) == 1
        grads: dict = {}
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        dense_sum: Optional[np.ndarray] = None
        for n, sparse, dense in self._batches:
            w = 1.0 if single else n / samples
            for table, pieces in sparse.items():
                parts.setdefault(table, []).extend(
                    (k, g if single else g * w) for k, g in pieces)
            if dense is not None:
                d = dense if single else dense * w
                dense_sum = d if dense_sum is None else dense_sum + d
        for table, pieces in parts.items():
            if pieces:
                grads[table] = (np.concatenate([k for k, _ in pieces]),
                                np.concatenate([g for _, g in pieces]))
        if dense_sum is not None:
            grads[self.dense_table] = dense_sum
        # One forward of each table in one batch: its keys are distinct.
        unique = single and all(len(p) == 1 for p in parts.values())
        self.worker.push(grads, samples, unique_keys=unique)
        self._clear()

    def parameters(self) -> Iterable[torch.nn.Parameter]:
        return iter(self.params)
