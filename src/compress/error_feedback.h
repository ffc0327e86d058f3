// ErrorFeedback: the sender's memory of what lossy compression left out.
//
// Before a gradient is encoded, the residual held for it is added to it;
// after encoding, the part of that sum the payload does not carry (the sum
// minus the decoded payload, so the residual is exactly what the server will
// not see) becomes the new residual. Over any run of pushes of one tensor or
// row, Σ gradients = Σ decoded + the residual now held, up to float
// rounding: compression delays gradient mass instead of losing it, except
// where the limits below drop a residual.
//
// What is held:
//   - Dense tensors: one residual per tensor name, as long as the tensor,
//     kept until the tensor's next push. Dense tensors are pushed every step
//     and sized by the model, so they need no age rule.
//   - Row sets: per table, a residual per row (key). Two rules bound them:
//       age: each EncodeRows call is one encode of its table; a row's
//            residual is dropped at the end of the `max_age`-th encode of its
//            table that did not include the row's key.
//       cap: at most `max_rows_per_table` rows hold a residual; storing one
//            more first drops the row refreshed longest ago (within one
//            encode, the key given first).
//   - A residual that is all zeros is not stored, so a lossless push (codec
//     none, or `sparse` with keep_fraction 0) leaves nothing behind for the
//     rows it carried; rows it did not carry keep aging.
//
// Thread-safety: thread-compatible; one instance per worker, used from one
// thread at a time.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "compress/codec.h"

namespace hetps {

struct ErrorFeedbackLimits {
  // Rows per table holding a residual; 0 keeps none (no feedback for rows).
  size_t max_rows_per_table = size_t{1} << 20;
  // Encodes of a table a row may miss before its residual is dropped; 0
  // keeps none.
  uint32_t max_age = 64;
};

class ErrorFeedback {
 public:
  explicit ErrorFeedback(const ErrorFeedbackLimits& limits = {});

  // Adds the residual held for `tensor` to `grad`, encodes the sum with
  // `spec` into *payload (codec.h's EncodeDense) and keeps what the payload
  // misses as the new residual. INVALID_ARGUMENT, with the residual
  // unchanged and *payload cleared, when `grad` is not as long as the
  // residual held for `tensor`, or when a lossy payload fails to decode
  // (a NaN or Inf in `grad`).
  absl::Status EncodeDense(std::string_view tensor, const CodecSpec& spec,
                           std::span<const float> grad, std::string* payload);

  // The same for a row set of `table` (codec.h's EncodeRows): keys.size()
  // distinct keys, rows holding keys.size() * dim floats, dim >= 1 and the
  // same for every call on `table` while it holds residuals. Breaking those,
  // or a NaN/Inf with a lossy codec, gives INVALID_ARGUMENT with the
  // residuals unchanged and *payload cleared.
  absl::Status EncodeRows(std::string_view table, const CodecSpec& spec,
                          uint32_t dim, std::span<const uint64_t> keys,
                          std::span<const float> rows, std::string* payload);

  // Rows of `table` holding a residual.
  size_t residual_rows(std::string_view table) const;
  // The residual held for a tensor or row; empty when none is. The view is
  // valid until the next Encode call.
  std::span<const float> dense_residual(std::string_view tensor) const;
  std::span<const float> row_residual(std::string_view table,
                                      uint64_t key) const;

 private:
  struct TableResiduals {
    uint32_t dim = 0;
    uint64_t encodes = 0;  // successful EncodeRows calls so far
    struct Row {
      uint64_t refreshed;  // `encodes` when the residual was stored
      uint32_t slot;       // values[slot * dim, (slot + 1) * dim)
      std::list<uint64_t>::iterator age_position;
    };
    std::unordered_map<uint64_t, Row> rows;
    // Keys in `rows`, least recently refreshed first.
    std::list<uint64_t> by_age;
    std::vector<float> values;
    std::vector<uint32_t> free_slots;

    // Empty when `key` holds no residual.
    std::span<const float> Residual(uint64_t key) const;
    void Drop(uint64_t key);
    // Drops the oldest row when `rows` is full. REQUIRES: max_rows >= 1.
    void Store(uint64_t key, std::span<const float> residual, size_t max_rows);
  };

  const ErrorFeedbackLimits limits_;
  std::map<std::string, std::vector<float>, std::less<>> dense_;
  std::map<std::string, TableResiduals, std::less<>> tables_;
  // Scratch reused across calls, so a push allocates nothing once warm.
  std::vector<float> corrected_;
  std::vector<float> decoded_;
  std::vector<uint64_t> decoded_keys_;
};

}  // namespace hetps
