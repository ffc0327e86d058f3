// Tensors handed to gRPC in slices of their own (DESIGN.md, Wire).
//
// A protobuf `bytes` field is a std::string: rows written into it are
// copied again when gRPC serializes the message (and zero-filled first,
// by the string's resize), and a received field is copied out of gRPC's
// buffers into a string before the reader copies it to where it belongs.
// Here a tensor is written once, into a TensorSlice that the transport
// sends as it is (WireWriter), and read once, from gRPC's buffers to its
// destination (ParseWithBytesField). On the wire nothing changes: the
// slice goes out as the bytes field it stands for, so either side may be
// an ordinary protobuf message.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <grpcpp/support/status.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message_lite.h"

namespace hetps {

// A buffer of `bytes` (64-byte aligned, not initialized) in a slice that
// owns it: gRPC gives it back when it is done with it, after the call has
// returned if it must. Large buffers come from, and go back to, a few kept
// for the next tensors: the same sizes come and go with every request, and
// a buffer taken fresh from the heap each time is faulted in again page by
// page, while the heap grows around the small allocations made between
// them (measured: docs/BENCHMARKS.md section 1, "Tensors in slices").
grpc::Slice NewTensorBuffer(size_t bytes);

// n elements of T, not initialized, in a slice that owns them: fill them
// through `data`, then send `slice`. Copies share the buffer.
template <typename T>
struct TensorSlice {
  static_assert(std::is_trivially_copyable_v<T>);

  explicit TensorSlice(size_t n = 0)
      : slice(n == 0 ? grpc::Slice() : NewTensorBuffer(n * sizeof(T))),
        data(reinterpret_cast<T*>(const_cast<uint8_t*>(slice.begin())), n) {}

  grpc::Slice slice;
  std::span<T> data;
};

// A message's wire form built as slices: the protobuf parts serialized
// into one buffer, tensors appended as the slices they are (a small one
// is copied: a slice of its own costs more than the copy).
class WireWriter {
 public:
  // `message` serialized (its fields, not framed).
  void Append(const google::protobuf::MessageLite& message);
  // The tag of length-delimited field `field` and `length`: what must
  // follow is `length` bytes of that field (a nested message's fields, or
  // a Bytes).
  void Field(uint32_t field, size_t length);
  // `bytes` themselves.
  void Bytes(grpc::Slice bytes);
  grpc::ByteBuffer Finish();

  // The bytes Field(field, length) and `length` bytes take together.
  static size_t FieldSize(uint32_t field, size_t length);

 private:
  std::string buffer_;
  std::vector<grpc::Slice> slices_;
};

// The wire form of `message` with its bytes field number `field` holding
// `bytes` (the field must be empty in `message`).
grpc::ByteBuffer SerializeWithBytesField(
    const google::protobuf::MessageLite& message, uint32_t field,
    grpc::Slice bytes);

// Reads a message's fields from `in` up to its current limit: for each
// length-delimited field whose number is in `fields`, `take(field, length,
// in)` must read exactly its `length` bytes (false: the bytes are not
// that field); every other field is copied into `rest`. False for bytes
// protobuf's own parser refuses, inside groups too (a tag or length cut
// short or of more than five bytes, a tag 0, a length past the limit, a
// group that does not end with its own end tag or nests too deep) —
// before `take` sees them.
using FieldReader =
    std::function<bool(uint32_t field, uint32_t length,
                       google::protobuf::io::CodedInputStream& in)>;
bool ReadFieldsApart(google::protobuf::io::CodedInputStream& in,
                     std::span<const uint32_t> fields, const FieldReader& take,
                     std::string* rest);

// Parses `buffer` into `message`, except its bytes field number `field`:
// `take(length, in)` receives that field's length and must read exactly
// that many bytes from `in`, or answer an error (the parse fails with it).
// `take` is not called when the field is absent. Bytes that are not the
// message answer `malformed`. Consumes `buffer`.
using BytesFieldReader = std::function<grpc::Status(
    uint32_t length, google::protobuf::io::CodedInputStream& in)>;
grpc::Status ParseWithBytesField(grpc::ByteBuffer* buffer,
                                 google::protobuf::MessageLite* message,
                                 uint32_t field, const BytesFieldReader& take,
                                 const grpc::Status& malformed);

}  // namespace hetps
