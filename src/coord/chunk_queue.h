// ChunkQueue: how the train split is handed out (docs/ARCHITECTURE.md, "Data
// in chunks"). The split is cut into `chunks` shards; Next hands them out in
// order, epoch after epoch, to whichever worker asks, so faster workers
// train on more of them and nobody waits at an epoch's end. The job's last
// 2 × workers chunks go out in quarters, so the job does not wait at the end
// for a slow worker's whole chunk. A worker holds its chunk (its lease)
// until it asks for the next; Requeue puts the chunk of a worker that died
// or restarted back at the front (what it had trained of it is trained
// again).
//
// A plain value: no locks, no time, no I/O. The coordinator holds its lock
// around every call.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "hetps.pb.h"

namespace hetps {

class ChunkQueue {
 public:
  // `chunks` >= 1 per epoch, `epochs` >= 0, `workers` >= 1.
  ChunkQueue(uint32_t chunks, int epochs, uint32_t workers);

  // The next chunk for `worker` (< workers), which trained
  // `finished_samples` of the chunk it held, if any, and has received
  // `received` chunks; `done` once every chunk of every epoch is handed
  // out. When the worker has received one chunk fewer than it was handed,
  // the reply to its last ask was lost: it gets that chunk again, and
  // nothing is counted (so a worker may ask again after any failure).
  rpc::ChunkResponse Next(uint32_t worker, uint64_t finished_samples,
                          uint64_t received);

  // `worker`'s chunk in hand goes back to the front of the queue; returns
  // it (nullopt when it held none).
  std::optional<rpc::ChunkResponse> Requeue(uint32_t worker);

  // For checkpoints: chunks held by workers count as not handed out, so a
  // resumed job trains them again.
  rpc::JobProgress Save() const;
  void Restore(const rpc::JobProgress& progress);

  uint64_t total() const { return total_; }  // chunks × epochs
  uint64_t given() const { return given_; }  // new chunks handed out so far
  uint64_t pending() const { return tail_.size(); }
  uint64_t finished_chunks() const { return finished_chunks_; }
  uint64_t finished_samples() const { return finished_samples_; }
  uint64_t requeued() const { return requeued_; }
  // Chunks handed to `worker` so far.
  uint64_t chunks_of(uint32_t worker) const { return leases_[worker].count; }

 private:
  struct Lease {
    std::optional<rpc::ChunkResponse> held;
    uint64_t count = 0;
  };

  const uint32_t chunks_;
  const uint64_t total_;
  const uint32_t workers_;
  uint64_t given_ = 0;
  // Chunks to hand out before the next new one: quarters of the job's last
  // chunks and chunks given back.
  std::deque<rpc::ChunkResponse> tail_;
  std::vector<Lease> leases_;
  uint64_t finished_chunks_ = 0;
  uint64_t finished_samples_ = 0;
  uint64_t requeued_ = 0;
};

}  // namespace hetps
