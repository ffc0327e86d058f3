// Tensors on the wire are raw little-endian bytes fields (DESIGN.md, Wire).
// These helpers read them in place and build them without extra copies.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hetps {

static_assert(std::endian::native == std::endian::little,
              "hetps puts host-order tensors on the wire; add byte swapping "
              "before porting to a big-endian host");

// A view of `bytes` as elements of T. The caller checked that bytes.size() is
// a multiple of sizeof(T). When the buffer is suitably aligned (the usual
// case for protobuf strings) the view points into `bytes`; otherwise the
// elements are copied into `scratch` and the view points there. The view
// lives as long as both arguments are unchanged.
template <typename T>
std::span<const T> ViewAs(std::string_view bytes, std::vector<T>& scratch) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t n = bytes.size() / sizeof(T);
  if (n == 0) return {};  // (an empty slice's data may be anywhere)
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(T) == 0) {
    return {reinterpret_cast<const T*>(bytes.data()), n};
  }
  scratch.resize(n);
  std::memcpy(scratch.data(), bytes.data(), n * sizeof(T));
  return {scratch.data(), n};
}

// Resizes `bytes` to hold n elements of T and returns a writable view of it,
// so replies are filled in place instead of being built and copied.
template <typename T>
std::span<T> ResizeAs(std::string* bytes, size_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  bytes->resize(n * sizeof(T));
  // std::string's heap buffer comes from operator new: aligned for T.
  return {reinterpret_cast<T*>(bytes->data()), n};
}

template <typename T>
void AssignBytes(std::string* bytes, std::span<const T> values) {
  bytes->assign(reinterpret_cast<const char*>(values.data()),
                values.size() * sizeof(T));
}

}  // namespace hetps
