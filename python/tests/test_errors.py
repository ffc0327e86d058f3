"""Bad requests from Python raise the exception class of their status code,
with the server's message, and leave the job serving with nothing lost."""

from __future__ import annotations

import numpy as np
import pytest

import hetps
from test_worker import KEYS, job_yaml


@pytest.fixture
def worker(servers):
    job = servers(job_yaml("async", 1, "server: {max_keys_per_request: 1000}"))
    w = job.worker(0)
    # Known state: every row of KEYS at -1, the dense table at -2.
    w.push({"emb": (KEYS, np.ones((50, 4), np.float32)),
            "w": np.full(10, 2.0, np.float32)}, batch_size=1)
    yield w
    w.finish()


def still_serving(w) -> None:
    np.testing.assert_array_equal(w.pull_sparse("emb", KEYS),
                                  np.full((50, 4), -1.0, np.float32))
    np.testing.assert_array_equal(w.pull_dense("w"), np.full(10, -2.0))


def test_unknown_table_is_not_found(worker):
    with pytest.raises(hetps.NotFoundError, match="unknown table 'nope'"):
        worker.pull_sparse("nope", KEYS)
    with pytest.raises(LookupError):
        worker.push({"nope": np.zeros(3, np.float32)}, 1)
    still_serving(worker)


def test_wrong_dimension_is_invalid_argument(worker):
    with pytest.raises(hetps.InvalidArgumentError, match="emb"):
        worker.push({"emb": (KEYS, np.ones((50, 3), np.float32))}, 1)
    with pytest.raises(ValueError):
        worker.push({"w": np.ones(11, np.float32)}, 1)
    with pytest.raises(ValueError, match="out"):
        worker.pull_sparse("emb", KEYS, out=np.empty((50, 3), np.float32))
    still_serving(worker)


def test_nan_gradient_is_refused_whole(worker):
    # Refused before any server sees a part: no row of the push moves.
    rows = np.ones((50, 4), np.float32)
    rows[17, 2] = np.nan
    with pytest.raises(hetps.InvalidArgumentError, match="non-finite"):
        worker.push({"emb": (KEYS, rows)}, 1)
    dense = np.ones(10, np.float32)
    dense[3] = np.inf
    with pytest.raises(hetps.InvalidArgumentError, match="non-finite"):
        worker.push({"w": dense}, 1)
    still_serving(worker)


def test_too_many_keys_is_resource_exhausted(worker):
    many = np.arange(5000, dtype=np.uint64)
    with pytest.raises(hetps.ResourceExhaustedError):
        worker.pull_sparse("emb", many)
    still_serving(worker)


def test_wrong_array_types_are_type_errors(worker):
    with pytest.raises(TypeError, match="keys: expected dtype uint64"):
        worker.pull_sparse("emb", KEYS.astype(np.float64))
    with pytest.raises(TypeError, match="float32"):
        worker.push({"w": np.ones(10, np.float64)}, 1)
    still_serving(worker)


def test_bad_config_names_the_field(servers):
    with pytest.raises(hetps.InvalidArgumentError, match="cluster.workers"):
        hetps.Worker("", 0, ["cluster.workers=0",
                             "cluster.ps_endpoints=127.0.0.1:1"])
    with pytest.raises(hetps.InvalidArgumentError, match="rank"):
        hetps.Worker("", 5, ["cluster.workers=2", "train.model=lr",
                             "cluster.ps_endpoints=127.0.0.1:1"])


def test_unreachable_server_is_unavailable():
    with pytest.raises(hetps.UnavailableError, match="127.0.0.1:1"):
        hetps.Worker("", 0, ["cluster.ps_endpoints=127.0.0.1:1",
                             "client.connect_deadline_s=0.5",
                             "cluster.workers=1", "train.model=lr"])
