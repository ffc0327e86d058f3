// How a push's gradient values are encoded on the wire (docs/PROTOCOL.md,
// "Gradient payloads"): the public value types PsClient::Push takes. The
// encoders and decoders live in src/compress/.
#pragma once

#include <cstdint>

namespace hetps {

// What a push's values are encoded with; travels on the wire as this byte.
enum class CodecKind : uint8_t {
  kNone = 0,
  kFp16 = 1,
  kInt8 = 2,
  kSparseFp32 = 3,
  kSparseFp16 = 4,
  kSparseInt8 = 5,
};

struct CodecSpec {
  CodecKind kind = CodecKind::kNone;
  // Sparse kinds: the fraction of entries (dense) or rows (row sets) kept by
  // magnitude, in [0, 1]; 0 keeps every non-zero one. Ignored otherwise.
  double keep_fraction = 0;
  // int8 kinds: values per scale, across row boundaries for row sets; 0 =
  // 256, dense and row sets alike. Ignored otherwise.
  uint32_t int8_block = 0;
};

}  // namespace hetps
