// Reader: streams one worker's share of a data set, batch by batch.
//
// Every reader splits its input deterministically: the record with number r
// (0-based, in file order) goes to the test split when
// Mix64(split_seed ^ Mix64(r)) maps below test_fraction, otherwise to the
// train split; within a split, worker w of W reads the records whose index
// in that split ≡ w (mod W). The same config therefore gives every worker a
// disjoint share and the same test set on every run.
//
// Malformed records are skipped and counted; the first few are reported with
// their line number. When more than data.max_bad_fraction of the records read
// so far are bad (checked after at least 100 records), Next() fails with
// INVALID_ARGUMENT naming the file and the first bad line — the file is
// probably not in the configured format.
//
// Not thread-safe: one reader per training loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "hetps/config.h"

namespace hetps {

enum class Split { kTrain, kTest };

struct ReaderStats {
  uint64_t records = 0;  // records of any split seen (parsed or not)
  uint64_t samples = 0;  // samples delivered to this reader's caller
  uint64_t malformed = 0;
  // "path:line: reason" of the first malformed records (at most 10).
  std::vector<std::string> examples;
};

class Reader {
 public:
  virtual ~Reader() = default;

  // Slots and dense features of every sample this reader yields.
  virtual int num_slots() const = 0;
  virtual int num_dense() const = 0;

  // Clears `batch` and fills it with up to `max_samples` samples of this
  // reader's share. Returns the number filled; 0 at the end of the data.
  virtual absl::StatusOr<size_t> Next(size_t max_samples, Batch* batch) = 0;

  // Starts the share again from its first record (next epoch).
  virtual absl::Status Rewind() = 0;

  // Switches to share `shard` of `num_shards` and starts it from its first
  // record, as pass `pass` (0-based; a shuffled reader permutes each pass
  // differently). Chunked training reads chunk after chunk through one
  // reader this way. Shard s of N is exactly the union of shards s + N·k of
  // K·N (k < K), so a chunk can be split into finer ones.
  virtual absl::Status Seek(uint32_t shard, uint32_t num_shards,
                            uint32_t pass) = 0;

  virtual const ReaderStats& stats() const = 0;
};

struct DataShape {
  int num_slots = 0;
  int num_dense = 0;
};

// The shape every reader of `config` yields, known without opening a file
// (so servers can size the model's tables): synthetic `fields` slots;
// movielens 3 slots (user, movie, genres) or 4 with tags; criteo 39 slots
// (13 bucketised integer columns, then 26 categorical) and 13 dense values;
// libsvm 1 slot; libfm `libfm_slots` slots.
absl::StatusOr<DataShape> ShapeOf(const DataConfig& config);

// Opens the data set of `config` (format, path, split settings) for
// `split`, as shard `shard` of `num_shards`. NOT_FOUND when a file is
// missing; INVALID_ARGUMENT for an unknown format.
absl::StatusOr<std::unique_ptr<Reader>> OpenReader(const DataConfig& config,
                                                   Split split, uint32_t shard,
                                                   uint32_t num_shards);

}  // namespace hetps
