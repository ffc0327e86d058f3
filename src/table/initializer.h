// Deterministic initial values: a function of (seed, key, column) only, so a
// row gets the same start on any server, in any order, after any restart.
#pragma once

#include <cstdint>

#include "hetps/config.h"

namespace hetps {

// The value of column `column` of the row for `key` (dense tables pass the
// global element index as `key` and 0 as `column`). Thread-safe, pure.
float InitialValue(const InitializerConfig& init, uint64_t key,
                   uint64_t column);

}  // namespace hetps
