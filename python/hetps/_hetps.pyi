"""Types of the hetps C++ extension (python/src/module.cc)."""

from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

__version__: str
_REPORT_PREFIX: str  # the launcher's report-line marker (worker/session.h)

Keys = Union[npt.NDArray[np.uint64], npt.NDArray[np.int64], Sequence[int]]
Floats = npt.NDArray[np.float32]
SparseGrad = tuple[Keys, Floats]

class Batch:
    """A batch of a worker's share of the data; the arrays are views of
    its buffers (valid as long as the batch or an array of it lives)."""

    @property
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def num_slots(self) -> int: ...
    @property
    def num_dense(self) -> int: ...
    @property
    def epoch(self) -> int:
        """Epochs finished before this batch's chunk."""
    @property
    def labels(self) -> npt.NDArray[np.float32]:
        """(size,) 0 or 1."""
    @property
    def dense(self) -> npt.NDArray[np.float32]:
        """(size, num_dense) real-valued features."""
    @property
    def keys(self) -> npt.NDArray[np.uint64]:
        """The feature keys of every (sample, slot), CSR by ``offsets``."""
    @property
    def offsets(self) -> npt.NDArray[np.uint32]:
        """(size * num_slots + 1,): sample i, slot s holds
        keys[offsets[i * num_slots + s]:offsets[i * num_slots + s + 1]]."""

class _Worker:
    def __init__(
        self,
        config: str = "",
        rank: int = -1,
        overrides: Sequence[str] = ...,
        environ: Mapping[str, str] = ...,
    ) -> None: ...
    def fix_plan(self, batch_size: int, push_freq: int) -> None:
        """Fixes this worker's batch size and push_freq (0: follow the
        planner)."""
    @property
    def rank(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def batch_size(self) -> int:
        """The batch size next_batch() uses now (the plan's, or fixed)."""
    @property
    def push_freq(self) -> int:
        """Batches per push (the plan's, or fixed)."""
    @property
    def num_slots(self) -> int: ...
    @property
    def num_dense(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def mode(self) -> str:
        """sync, async or semi_async."""
    @property
    def endpoints(self) -> list[str]: ...
    @property
    def tables(self) -> list[dict[str, Any]]:
        """name, kind (sparse/dense), dim, optimizer, learning_rate."""
    @property
    def train_config(self) -> dict[str, Any]:
        """The job's train settings a loop follows: epochs, batch_size,
        eval_every_epochs, eval_every_s, data_format."""
    def table_dim(self, table: str) -> int:
        """Row width of a sparse table, size of a dense one."""
    def pull_sparse(
        self,
        table: str,
        keys: Keys,
        out: Optional[Floats] = None,
        unique_keys: bool = False,
    ) -> Floats:
        """(len(keys), dim) rows; duplicates fetched once (``unique_keys``:
        the caller promises there are none, skipping that pass). ``out``: a
        C-contiguous float32 array to fill (and return) instead."""
    def pull_unique(
        self, table: str, keys: Keys
    ) -> tuple[npt.NDArray[np.uint64], Floats, npt.NDArray[np.int64]]:
        """(distinct keys in first-seen order, their rows, the index of
        every key's row)."""
    def pull_dense(self, table: str, out: Optional[Floats] = None) -> Floats: ...
    def push(
        self,
        grads: Mapping[str, Union[Floats, SparseGrad]],
        batch_size: int,
        unique_keys: bool = False,
    ) -> None:
        """One push of the mean gradients of ``batch_size`` samples:
        ``{table: values}`` for dense tables, ``{table: (keys, rows)}`` for
        sparse ones (duplicate keys are summed unless ``unique_keys``).
        Encoded by the job's codec with error feedback; refused whole on a
        NaN/Inf."""
    def next_batch(self) -> Optional[Batch]:
        """This worker's next batch, None once the job's data is done."""
    def rewind_test(self) -> None: ...
    def next_test_batch(self, max_samples: int = 4096) -> Optional[Batch]: ...
    def record_loss(self, mean_loss: float, samples: int) -> None:
        """The batch's mean loss, for the report and the over-compression
        check."""
    def record_eval(self, auc: float, logloss: float, epoch: int) -> None:
        """An evaluation during training, for the report."""
    def _finish(self) -> None: ...
    def _record_final_eval(self, auc: float, logloss: float) -> None: ...
    def _abandon(self, reason: str) -> None: ...
    def _report(self) -> str: ...
    def _status(self, timeout_s: float = 10.0) -> str: ...

def auc(scores: Floats, labels: Floats) -> float:
    """Area under the ROC curve (ties averaged)."""

def logloss(p: Floats, labels: Floats) -> float: ...
def _query_status(endpoint: str, config: str = "", timeout_s: float = 10.0) -> str: ...
