// SparseTable: 64-bit key → row of `dim` floats plus optimizer state and an
// update count. Rows are created on first touch (pull or push) with the
// table's deterministic initialiser.
//
// Thread-safety: all methods may be called concurrently. The key space is
// split into lock stripes; each stripe is an open-addressing hash map from key
// to a slot in contiguous row storage. A call takes each stripe's lock at
// most once (keys are grouped by stripe first), so a 100k-key request costs
// `stripes` lock round trips, not 100k.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "hetps/config.h"
#include "table/optimizer.h"

namespace hetps {

class SparseTable {
 public:
  // `config.kind` must be kSparse and `config.dim` >= 1 (validated by the
  // caller). `stripes` >= 1.
  SparseTable(const TableConfig& config, std::unique_ptr<Optimizer> optimizer,
              int stripes);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  const TableConfig& config() const { return config_; }
  uint64_t dim() const { return config_.dim; }

  // Copies the rows of `keys` into `out` (keys.size() * dim floats, row-major),
  // creating missing rows. Duplicate keys are allowed. Both spans are only
  // read/written during the call.
  void Pull(std::span<const uint64_t> keys, std::span<float> out);

  // Applies one optimizer step per key with gradient rows `grads`
  // (keys.size() * dim floats). Keys must be unique within a call; values
  // must be finite (the server validates both before calling).
  void Push(std::span<const uint64_t> keys, std::span<const float> grads);

  // Number of rows held.
  uint64_t size() const;

  // Copies the row of `key` into `out` (dim floats) without creating it.
  // Returns false when the row does not exist.
  bool Lookup(uint64_t key, std::span<float> out) const;

  // Calls `fn(key, weights, update_count)` for every row, stripe by stripe
  // (each stripe locked while it is visited). Order is unspecified.
  void ForEachRow(const std::function<void(uint64_t, std::span<const float>,
                                           uint64_t)>& fn) const;

 private:
  struct Stripe;
  int StripeOf(uint64_t key) const;
  // Adds the initialised row of `key` (whose mixed hash is `hash`), which
  // `stripe` does not hold, and returns its slot. REQUIRES: stripe.mu held.
  uint32_t CreateRow(Stripe& stripe, uint64_t key, uint64_t hash);
  // Calls use(j, row block) for each of keys[0, count), all in `stripe`,
  // creating missing rows, with index and rows prefetched ahead.
  // REQUIRES: stripe.mu held.
  template <typename Use>
  void VisitRows(Stripe& stripe, const uint64_t* keys, uint32_t count,
                 Use use);

  const TableConfig config_;
  const std::unique_ptr<Optimizer> optimizer_;
  const uint64_t state_width_;
  // Floats per row block (key, update count, weights, optimizer state; see
  // sparse_table.cc), even so that the 64-bit fields stay aligned.
  const uint64_t row_stride_;
  std::vector<std::unique_ptr<Stripe>> stripes_;
};

}  // namespace hetps
