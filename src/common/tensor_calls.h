// The calls that carry a worker's tensors, Push and PullSparse, with the
// tensors in slices of their own (common/slices.h): a push's keys and
// gradients and a pull's keys are written once, into the buffers the
// transport sends, and a pull's rows go from gRPC's buffers straight to
// where the caller wants them; a server reads a push's tensors out of
// gRPC's buffers once, into buffers of their own (ParsePush). On the wire
// they are the ordinary PushRequest, PullSparseRequest and
// PullSparseResponse.
//
// TensorCalls is PsClient's seam for these two calls, as the generated
// stub is for the others (common/channel.h): the real one calls a server
// over gRPC, tests hand in one that fails calls on purpose
// (tests/support/faulty_stub.h).
//
// The real one sends a call whose tensors are small as a TensorFrame on
// one stream to the server (ParameterServer.TensorStream), opened by the
// first call and again by the first call after it ended: on a stream a
// call costs no HTTP/2 stream of its own (1k-key calls 2-11% faster,
// 10k-key ones level: docs/BENCHMARKS.md section 1, "Small calls on one
// stream"). Larger calls take the unary methods, where one large answer
// does not hold up the others. Either way the caller
// sees the same answers and errors: the call's deadline is kept by the
// client, a stream that ends fails its calls in flight (UNAVAILABLE unless
// the server ended it with another status), and the server handles a
// frame as it would the unary call.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/slices.h"
#include "hetps.pb.h"

namespace hetps {

// A PushRequest: `message` without its gradients, then each gradient.
struct PushCall {
  // One table's gradient: `message` names the table (and holds a codec's
  // payload in `values`); raw keys and values are in the slices.
  struct Gradient {
    rpc::TableGradient message;
    TensorSlice<uint64_t> keys;
    TensorSlice<float> values;
  };
  rpc::PushRequest message;
  std::vector<Gradient> gradients;
};

// A PushRequest as a server reads it: `message` with its gradients' other
// fields, and each gradient's raw keys and values (`gradients[i]` those of
// message.gradients(i)) in buffers of their own, copied once out of gRPC's
// buffers (64-byte aligned; a codec's payload in `values` as it came).
struct ReceivedPush {
  struct Tensors {
    grpc::Slice keys;
    grpc::Slice values;
    // The values, read as floats, were checked on the way and are all
    // finite (false: not checked, or some are not).
    bool finite = false;
  };
  rpc::PushRequest message;
  std::vector<Tensors> gradients;
};

// Parses a PushRequest, whoever wrote it, into `push`; consumes `buffer`.
grpc::Status ParsePush(grpc::ByteBuffer* buffer, ReceivedPush* push);

// A PullSparseRequest: `message` without its keys, then the keys.
struct PullSparseCall {
  rpc::PullSparseRequest message;
  TensorSlice<uint64_t> keys;
};

// Where a PullSparseResponse goes: its rows straight into the caller's
// buffer (row i of the reply to rows[positions[i] * dim, + dim)), the rest
// into `message`. A reply with another number of rows fails the call
// (INTERNAL) before any row is written.
struct PulledRows {
  std::span<float> rows;
  std::span<const uint32_t> positions;
  uint64_t dim = 0;
  rpc::PullSparseResponse message;  // without `values`
};

// For a gather or scatter of rows by position: fn(0, positions[0], n)
// once when all n positions are consecutive (a request to one server), so
// that the rows are copied at once; else fn(i, positions[i], 1) for each.
// (Finding shorter runs costs more than it saves: in a request split
// among servers whether the next position follows is a coin toss, and
// the branch mispredicts.)
template <typename Fn>
void ForEachRun(std::span<const uint32_t> positions, Fn fn) {
  if (positions.empty()) return;
  const uint32_t first = positions[0];
  size_t n = 1;
  while (n < positions.size() && positions[n] == first + n) ++n;
  if (n == positions.size()) return fn(0, first, n);
  for (size_t i = 0; i < positions.size(); ++i) fn(i, positions[i], 1);
}

class TensorCalls {
 public:
  using Done = std::function<void(grpc::Status)>;

  virtual ~TensorCalls() = default;
  // As the generated stub's callback calls: `call` and `answer` must stay
  // valid until `done`.
  virtual void Push(grpc::ClientContext* context, const PushCall* call,
                    rpc::PushResponse* response, Done done) = 0;
  virtual void PullSparse(grpc::ClientContext* context,
                          const PullSparseCall* call, PulledRows* answer,
                          Done done) = 0;
};

// The real calls, over `channel`.
std::unique_ptr<TensorCalls> GrpcTensorCalls(
    std::shared_ptr<grpc::ChannelInterface> channel);

// The largest tensors, in bytes, a call on the stream carries each way:
// a push's keys and values, a pull's keys and its answer's rows. A 10k x 16
// push (720 KB) goes on it; a 100k-key pull (800 KB of keys) did not gain
// there, and stays unary.
inline constexpr size_t kStreamMaxTensorBytes = 768 << 10;

// A TensorFrame's wire form: `header` (without `body`), then `body` as
// its slices.
grpc::ByteBuffer WriteFrame(const rpc::TensorFrame& header,
                            const grpc::ByteBuffer& body);
// Parses a frame into `header` (without `body`) and `body`, which shares
// the frame's slices. Consumes `frame`. INVALID_ARGUMENT when the bytes
// are not a TensorFrame.
grpc::Status ReadFrame(grpc::ByteBuffer* frame, rpc::TensorFrame* header,
                       grpc::ByteBuffer* body);

// The request as the server parses it: for tests that look at what was
// sent.
rpc::PullSparseRequest ToMessage(const PullSparseCall& call);

}  // namespace hetps

namespace grpc {

template <>
class SerializationTraits<hetps::PushCall, void> {
 public:
  static Status Serialize(const hetps::PushCall& call, ByteBuffer* buffer,
                          bool* own_buffer);
};

template <>
class SerializationTraits<hetps::PullSparseCall, void> {
 public:
  static Status Serialize(const hetps::PullSparseCall& call, ByteBuffer* buffer,
                          bool* own_buffer);
};

template <>
class SerializationTraits<hetps::PulledRows, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, hetps::PulledRows* answer);
};

}  // namespace grpc
