"""hetps from Python: a worker of a hetps job, driven by your own training loop.

A ``Worker`` is one rank of a job whose servers already run (``hetps
launch`` starts both; see docs/PYTHON.md). It pulls and pushes rows and
dense arrays as numpy arrays, hands out this worker's capability-aware share
of the data as batches, and reports progress to the coordinator, so
semi_async, the window, the batch planner, compression with error feedback,
membership and checkpoints all work under a Python loop::

    import hetps

    with hetps.Worker.from_env() as worker:      # started by `hetps launch`
        for batch in worker.batches():
            keys, rows, inverse = worker.pull_unique("emb", batch.keys)
            ...                                  # forward and backward
            worker.push({"emb": (keys, row_grads)}, batch_size=len(batch))

``hetps.torch`` has PyTorch modules whose embedding rows live on the servers.
Every call that waits on the network releases the GIL.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from . import errors
from .errors import *  # noqa: F401,F403  (the exception classes)
from ._hetps import Batch, _Worker, __version__, auc, logloss
from ._hetps import _REPORT_PREFIX, _query_status

__all__ = [
    "Batch",
    "Cluster",
    "Worker",
    "auc",
    "get_ps_status",
    "init_ps_cluster",
    "init_worker",
    "logloss",
    "errors",
    "__version__",
] + errors.__all__

class Worker(_Worker):
    """One worker of a running hetps job.

    ``Worker(config, rank, overrides)`` builds the job's config as the CLI
    does (the YAML file, then ``path=value`` overrides as ``--set`` takes
    them), registers as ``rank``, connects to every server and waits until
    every worker of the job is there. Raises ``hetps.Error`` subclasses
    (``UnavailableError`` when a server stays unreachable,
    ``InvalidArgumentError`` naming a bad config field).

    ``batch_size`` / ``push_freq``: fixed values for this worker; ``None``
    follows the coordinator's batch planner (capability-aware, the default).
    """

    def __init__(
        self,
        config: str = "",
        rank: int = -1,
        overrides: Sequence[str] = (),
        *,
        batch_size: Optional[int] = None,
        push_freq: Optional[int] = None,
        environ: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(config, rank, list(overrides), dict(environ or {}))
        if batch_size is not None or push_freq is not None:
            self.fix_plan(batch_size or 0, push_freq or 0)
        self._print_report = False
        self._finished = False

    @classmethod
    def from_env(cls, **kwargs: Any) -> "Worker":
        """The worker ``hetps launch`` started this process as.

        Reads HETPS_CONFIG (the job's YAML), HETPS_SET (overrides, one per
        line), HETPS_RANK and the Paddle-style variables
        (PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINER_ID). ``finish()`` then
        prints the report line the launcher's summary is made of.
        """
        env = os.environ
        overrides = [o for o in env.get("HETPS_SET", "").split("\n") if o]
        rank = int(env.get("HETPS_RANK", "-1"))
        worker = cls(env.get("HETPS_CONFIG", ""), rank, overrides,
                     environ=dict(env), **kwargs)
        worker._print_report = "HETPS_RANK" in env
        return worker

    # -- the data feed -----------------------------------------------------

    def batches(self) -> Iterator[Batch]:
        """This worker's batches until the job's data is done.

        Chunks come from the coordinator (a fast worker gets more of them),
        batch sizes from the planner. Reading releases the GIL.
        """
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            yield batch

    def test_batches(self, batch_size: int = 4096) -> Iterator[Batch]:
        """The whole held-out split, from its start, in batches."""
        self.rewind_test()
        while True:
            batch = self.next_test_batch(batch_size)
            if batch is None:
                return
            yield batch

    def evaluate(
        self, predict: Callable[[Batch], Any], batch_size: int = 4096
    ) -> tuple[float, float]:
        """(AUC, logloss) of ``predict`` (batch -> probabilities) on the
        held-out split."""
        scores, labels = [], []
        for batch in self.test_batches(batch_size):
            p = np.asarray(predict(batch), dtype=np.float32).reshape(-1)
            scores.append(p)
            labels.append(np.array(batch.labels, copy=True))
        if not scores:
            raise errors.FailedPreconditionError(
                "the test split is empty (train.data.test_fraction?)")
        s, y = np.concatenate(scores), np.concatenate(labels)
        return auc(s, y), logloss(s, y)

    # -- status and the end ------------------------------------------------

    def status(self, timeout_s: float = 10.0) -> dict:
        """The job's status (``get_ps_status``)."""
        return json.loads(self._status(timeout_s))

    def report(self) -> dict:
        """This worker's report so far: samples, steps, throughput, bytes."""
        return json.loads(self._report())

    def finish(
        self, evaluate: Optional[Callable[[Batch], Any]] = None
    ) -> dict:
        """Leaves the live set and waits until every worker has: the model
        is final (push what is left first). Then rank 0 evaluates it with
        ``evaluate`` (batch -> probabilities) on the held-out split, if
        given; other ranks ignore it. Returns this worker's report (with
        ``test_auc`` and ``test_logloss`` when evaluated); a worker started
        by ``hetps launch`` also prints it for the launcher's summary."""
        self._finish()
        self._finished = True
        if evaluate is not None and self.rank == 0:
            self._record_final_eval(*self.evaluate(evaluate))
        report = self.report()
        if self._print_report:
            print(_REPORT_PREFIX + json.dumps(report), flush=True)
        return report

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if self._finished:
            return
        if kind is None:
            self.finish()
        else:
            # Nobody waits for a loop that failed; its chunk goes back.
            self._abandon(f"{kind.__name__}: {value}")
            self._finished = True


class Cluster:
    """A job's cluster as ``init_ps_cluster`` describes it: a config file (or
    none) plus overrides. ``init_worker`` connects a worker to it."""

    def __init__(self, config: str = "", overrides: Sequence[str] = ()) -> None:
        self.config = config
        self.overrides = list(overrides)

    def init_worker(
        self,
        rank: Optional[int] = None,
        batch_size: Optional[int] = None,
        push_freq: Optional[int] = None,
    ) -> Worker:
        """Connects worker ``rank`` (default: PADDLE_TRAINER_ID/HETPS_RANK)."""
        if rank is None:
            rank = int(os.environ.get("HETPS_RANK",
                                      os.environ.get("PADDLE_TRAINER_ID", -1)))
        return Worker(self.config, rank, self.overrides, batch_size=batch_size,
                      push_freq=push_freq, environ=dict(os.environ))


def _flow(value: Any) -> str:
    # JSON is YAML's flow style: lists and maps pass through --set as is.
    return json.dumps(value)


_cluster: Optional[Cluster] = None


def init_ps_cluster(
    ps_endpoints: Sequence[str],
    worker_endpoints: Optional[Sequence[str]] = None,
    async_mode: Union[str, bool] = "semi_async",
    window_size: int = 0,
    grad_compress: str = "none",
    *,
    workers: Optional[int] = None,
    tables: Optional[Sequence[Mapping[str, Any]]] = None,
    config: str = "",
    **fields: Any,
) -> Cluster:
    """Describes the job to join (SPEC §8).

    ``ps_endpoints``: the servers ("host:port"; the first one hosts the
    coordinator). ``worker_endpoints`` (or ``workers``): how many workers
    the job has. ``async_mode``: "sync", "async", "semi_async" (True means
    "async", False "sync"). ``window_size``: the semi_async window to start
    from (0: from the measured throughputs). ``grad_compress``: a codec
    (none, fp16, int8, sparse, sparse+fp16, sparse+int8, adaptive).
    ``tables``: the job's tables as YAML would list them, e.g.
    ``[{"name": "emb", "kind": "sparse", "dim": 8}]``. ``config``: a job
    YAML to start from; ``fields``: any other field as
    ``path=value`` with dots written as double underscores
    (``semi_async__window_max=64``). The servers must run with the same
    tables (``hetps server``, ``hetps launch``).
    """
    if isinstance(async_mode, bool):
        async_mode = "async" if async_mode else "sync"
    overrides = [
        "cluster.ps_endpoints=" + ",".join(ps_endpoints),
        f"mode={async_mode}",
        f"window={int(window_size)}",
        f"compress.codec={grad_compress}",
    ]
    if worker_endpoints:
        overrides.append("cluster.worker_endpoints=" + ",".join(worker_endpoints))
    if workers is not None:
        overrides.append(f"cluster.workers={int(workers)}")
    if tables is not None:
        overrides.append("tables=" + _flow(list(map(dict, tables))))
    for name, value in fields.items():
        path = name.replace("__", ".")
        text = _flow(value) if isinstance(value, (list, dict)) else str(value)
        if isinstance(value, bool):
            text = "true" if value else "false"
        overrides.append(f"{path}={text}")
    global _cluster
    _cluster = Cluster(config, overrides)
    return _cluster


def init_worker(
    batch_size: Optional[int] = None,
    push_freq: Optional[int] = None,
    rank: Optional[int] = None,
) -> Worker:
    """Connects this process as a worker of the cluster ``init_ps_cluster``
    described last (SPEC §8). ``batch_size``/``push_freq`` fix this
    worker's values; ``None`` follows the batch planner."""
    if _cluster is None:
        raise errors.FailedPreconditionError(
            "init_worker: call init_ps_cluster first")
    return _cluster.init_worker(rank, batch_size, push_freq)


def get_ps_status(
    worker: Union[Worker, str, None] = None, config: str = "",
    timeout_s: float = 10.0,
) -> dict:
    """The job's status: ``window_size``, ``worker_throughput`` (samples/s
    by rank), ``grad_queue_length``, ``max_staleness``, and everything
    ``hetps status --json`` shows (per worker and per server).

    ``worker``: a Worker of the job, or the coordinator's endpoint
    ("host:port", with ``config`` for its auth section), or None for the
    cluster ``init_ps_cluster`` described.
    """
    if isinstance(worker, Worker):
        return worker.status(timeout_s)
    if worker is None:
        if _cluster is None:
            raise errors.FailedPreconditionError(
                "get_ps_status: pass a Worker or an endpoint, or call "
                "init_ps_cluster first")
        endpoint = next(o for o in _cluster.overrides
                        if o.startswith("cluster.ps_endpoints="))
        worker = endpoint.split("=", 1)[1].split(",")[0]
        config = config or _cluster.config
    return json.loads(_query_status(worker, config, timeout_s))
