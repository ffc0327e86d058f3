"""A Python worker for `hetps launch` tests: logistic regression on the
job's data with one hetps EmbeddingBag of dim 1 (the weights), trained
through hetps.torch. With HETPS_TEST_KILL_RANK=r, worker r kills itself
with SIGKILL after HETPS_TEST_KILL_AFTER batches (default 5)."""

import os
import signal

import numpy as np
import torch
import torch.nn.functional as F

import hetps
import hetps.torch as ht


def logits(emb, batch):
    ids = torch.from_numpy(batch.keys.view(np.int64))
    offsets = torch.from_numpy(batch.offsets[:-1].astype(np.int64))
    n = len(batch)
    return emb(ids, offsets).view(n, batch.num_slots).sum(1)


def main() -> None:
    kill_rank = int(os.environ.get("HETPS_TEST_KILL_RANK", "-1"))
    kill_after = int(os.environ.get("HETPS_TEST_KILL_AFTER", "5"))
    with hetps.Worker.from_env() as worker:
        print(f"python worker {worker.rank} of {worker.num_workers} "
              f"({worker.mode}) connected", flush=True)
        emb = ht.EmbeddingBag(worker, "weights", mode="sum")
        ps = ht.PsModel(worker, torch.nn.Sequential(emb))
        for i, batch in enumerate(worker.batches()):
            if worker.rank == kill_rank and i == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            labels = torch.from_numpy(np.array(batch.labels))
            loss = F.binary_cross_entropy_with_logits(logits(emb, batch),
                                                      labels)
            loss.backward()
            ps.push(len(batch), loss=loss.item())
        ps.flush()
        emb.eval()
        with torch.no_grad():
            worker.finish(
                evaluate=lambda b: torch.sigmoid(logits(emb, b)).numpy())


if __name__ == "__main__":
    main()
