// Fuzzes ReadFrame, which splits a TensorStream frame off the wire into its
// header and its body (common/tensor_calls.h), the first thing a server
// does with what a client sends on its stream (and a client with what the
// server answers).
//
// Input: one steering byte, then the frame's bytes, in gRPC buffers of 1 to
// 31 bytes (the steering byte's high bits; 0: all in one). ReadFrame must
// accept exactly what protobuf's own TensorFrame parser accepts, and agree
// with it on every field: the header's, and the body byte for byte.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tensor_calls.h"
#include "fuzz_check.h"
#include "server_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetps;
  using namespace hetps::fuzz;
  Quiet();
  if (size < 1) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1),
                               size - 1);
  grpc::ByteBuffer frame = InBuffers(bytes, BufferSize(data[0], bytes.size()));
  rpc::TensorFrame header;
  grpc::ByteBuffer body;
  const grpc::Status status = ReadFrame(&frame, &header, &body);

  rpc::TensorFrame expected;
  const bool parsed =
      expected.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  FUZZ_CHECK(status.ok() == parsed);
  if (!parsed) {
    FUZZ_CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    return 0;
  }
  std::vector<grpc::Slice> slices;
  FUZZ_CHECK(body.Dump(&slices).ok());
  std::string body_bytes;
  for (const grpc::Slice& s : slices) {
    body_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  FUZZ_CHECK(body_bytes == expected.body());
  FUZZ_CHECK(header.body().empty());
  expected.clear_body();
  FUZZ_CHECK(header.SerializeAsString() == expected.SerializeAsString());
  return 0;
}
