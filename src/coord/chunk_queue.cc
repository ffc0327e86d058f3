#include "coord/chunk_queue.h"

namespace hetps {
namespace {

// The job's last chunks are cut into this many parts.
constexpr uint32_t kTailSplit = 4;

}  // namespace

ChunkQueue::ChunkQueue(uint32_t chunks, int epochs, uint32_t workers)
    : chunks_(chunks),
      total_(uint64_t{chunks} * static_cast<uint64_t>(epochs > 0 ? epochs : 0)),
      workers_(workers),
      leases_(workers) {}

rpc::ChunkResponse ChunkQueue::Next(uint32_t worker, uint64_t finished_samples,
                                    uint64_t received) {
  Lease& lease = leases_[worker];
  if (lease.held && lease.count == received + 1) return *lease.held;
  if (lease.held) {  // asking again: the last chunk is done
    ++finished_chunks_;
    finished_samples_ += finished_samples;
    lease.held.reset();
  }
  rpc::ChunkResponse out;
  if (!tail_.empty()) {
    out = tail_.front();
    tail_.pop_front();
  } else if (given_ >= total_) {
    out.set_done(true);
    return out;
  } else {
    const uint32_t chunk = static_cast<uint32_t>(given_ % chunks_);
    out.set_chunk(chunk);
    out.set_chunks(chunks_);
    out.set_epoch(static_cast<uint32_t>(given_ / chunks_));
    ++given_;
    // The job's last chunks go out in quarters: whoever draws the very last
    // one then holds the others up for a quarter of a chunk's time at most.
    if (total_ - given_ < uint64_t{2} * workers_) {
      out.set_chunks(chunks_ * kTailSplit);
      for (uint32_t k = 1; k < kTailSplit; ++k) {
        rpc::ChunkResponse part = out;
        part.set_chunk(chunk + chunks_ * k);
        tail_.push_back(part);
      }
    }
  }
  lease.held = out;
  ++lease.count;
  return out;
}

std::optional<rpc::ChunkResponse> ChunkQueue::Requeue(uint32_t worker) {
  Lease& lease = leases_[worker];
  if (!lease.held) return std::nullopt;
  std::optional<rpc::ChunkResponse> chunk = std::move(lease.held);
  lease.held.reset();
  tail_.push_front(*chunk);
  ++requeued_;
  return chunk;
}

rpc::JobProgress ChunkQueue::Save() const {
  rpc::JobProgress progress;
  progress.set_chunks_given(given_);
  progress.set_finished_chunks(finished_chunks_);
  progress.set_finished_samples(finished_samples_);
  for (const Lease& lease : leases_) {
    if (lease.held) *progress.add_pending() = *lease.held;
  }
  for (const rpc::ChunkResponse& c : tail_) *progress.add_pending() = c;
  return progress;
}

void ChunkQueue::Restore(const rpc::JobProgress& progress) {
  given_ = progress.chunks_given();
  finished_chunks_ = progress.finished_chunks();
  finished_samples_ = progress.finished_samples();
  tail_.assign(progress.pending().begin(), progress.pending().end());
  for (Lease& lease : leases_) lease.held.reset();
}

}  // namespace hetps
