#include "common/tensor_calls.h"

#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "google/protobuf/io/coded_stream.h"

namespace hetps {
namespace {

// The methods' full names (service hetps.rpc.ParameterServer).
const std::string& PushMethod() {
  static const std::string* name =
      new std::string("/hetps.rpc.ParameterServer/Push");
  return *name;
}
const std::string& PullSparseMethod() {
  static const std::string* name =
      new std::string("/hetps.rpc.ParameterServer/PullSparse");
  return *name;
}

class GrpcCalls final : public TensorCalls {
 public:
  explicit GrpcCalls(std::shared_ptr<grpc::ChannelInterface> channel)
      : push_(channel), pull_(channel) {}

  void Push(grpc::ClientContext* context, const PushCall* call,
            rpc::PushResponse* response, Done done) override {
    push_.UnaryCall(context, PushMethod(), grpc::StubOptions(), call, response,
                    std::move(done));
  }

  void PullSparse(grpc::ClientContext* context, const PullSparseCall* call,
                  PulledRows* answer, Done done) override {
    pull_.UnaryCall(context, PullSparseMethod(), grpc::StubOptions(), call,
                    answer, std::move(done));
  }

 private:
  grpc::TemplatedGenericStub<PushCall, rpc::PushResponse> push_;
  grpc::TemplatedGenericStub<PullSparseCall, PulledRows> pull_;
};

// Reads the `length` bytes of a field from `in` into a buffer of their own,
// a gRPC buffer at a time; with `finite` (else null), also whether the
// whole floats among them are all finite, each checked right after it is
// copied, while it is in the cache.
bool ReadTensor(google::protobuf::io::CodedInputStream& in, uint32_t length,
                grpc::Slice* out, bool* finite) {
  *out = length == 0 ? grpc::Slice() : NewTensorBuffer(length);
  auto* to = const_cast<uint8_t*>(out->begin());
  bool any_bad = false;
  size_t copied = 0;
  size_t checked = 0;  // floats
  while (copied < length) {
    const void* data = nullptr;
    int size = 0;
    if (!in.GetDirectBufferPointer(&data, &size) || size <= 0) return false;
    const size_t take = std::min<size_t>(size, length - copied);
    std::memcpy(to + copied, data, take);
    in.Skip(static_cast<int>(take));
    copied += take;
    if (finite != nullptr) {
      const size_t whole = copied / sizeof(float);
      any_bad |=
          AnyNonFinite<false>(reinterpret_cast<const float*>(to) + checked,
                              whole - checked, nullptr);
      checked = whole;
    }
  }
  if (finite != nullptr) *finite = !any_bad;
  return true;
}

// One TableGradient of `length` bytes: its raw keys and values into
// `tensors`, its other fields into `message`.
bool ReadGradient(google::protobuf::io::CodedInputStream& in, uint32_t length,
                  rpc::TableGradient* message, ReceivedPush::Tensors* tensors) {
  const auto limit = in.PushLimit(static_cast<int>(length));
  constexpr uint32_t kTensors[] = {rpc::TableGradient::kKeysFieldNumber,
                                   rpc::TableGradient::kValuesFieldNumber};
  std::string fields;
  const bool read = ReadFieldsApart(
      in, kTensors,
      [tensors](uint32_t field, uint32_t size,
                google::protobuf::io::CodedInputStream& from) {
        return field == rpc::TableGradient::kKeysFieldNumber
                   ? ReadTensor(from, size, &tensors->keys, nullptr)
                   : ReadTensor(from, size, &tensors->values, &tensors->finite);
      },
      &fields);
  in.PopLimit(limit);
  return read && message->ParseFromString(fields);
}

}  // namespace

grpc::Status ParsePush(grpc::ByteBuffer* buffer, ReceivedPush* push) {
  const grpc::Status malformed(grpc::StatusCode::INVALID_ARGUMENT,
                               "push: the request is not a PushRequest");
  std::vector<rpc::TableGradient> gradients;
  auto take = [&](uint32_t length, google::protobuf::io::CodedInputStream& in) {
    return ReadGradient(in, length, &gradients.emplace_back(),
                        &push->gradients.emplace_back())
               ? grpc::Status::OK
               : malformed;
  };
  if (grpc::Status s = ParseWithBytesField(
          buffer, &push->message, rpc::PushRequest::kGradientsFieldNumber, take,
          malformed);
      !s.ok()) {
    return s;
  }
  for (rpc::TableGradient& g : gradients) {
    *push->message.add_gradients() = std::move(g);
  }
  return grpc::Status::OK;
}

std::unique_ptr<TensorCalls> GrpcTensorCalls(
    std::shared_ptr<grpc::ChannelInterface> channel) {
  return std::make_unique<GrpcCalls>(std::move(channel));
}

rpc::PullSparseRequest ToMessage(const PullSparseCall& call) {
  rpc::PullSparseRequest message = call.message;
  message.set_keys(reinterpret_cast<const char*>(call.keys.data.data()),
                   call.keys.data.size_bytes());
  return message;
}

}  // namespace hetps

namespace grpc {

Status SerializationTraits<hetps::PushCall, void>::Serialize(
    const hetps::PushCall& call, ByteBuffer* buffer, bool* own_buffer) {
  using hetps::WireWriter;
  using hetps::rpc::TableGradient;
  WireWriter out;
  out.Append(call.message);
  for (const hetps::PushCall::Gradient& g : call.gradients) {
    const size_t keys = g.keys.slice.size();
    const size_t values = g.values.slice.size();
    size_t length = g.message.ByteSizeLong();
    if (keys > 0) {
      length += WireWriter::FieldSize(TableGradient::kKeysFieldNumber, keys);
    }
    if (values > 0) {
      length +=
          WireWriter::FieldSize(TableGradient::kValuesFieldNumber, values);
    }
    out.Field(hetps::rpc::PushRequest::kGradientsFieldNumber, length);
    out.Append(g.message);
    if (keys > 0) {
      out.Field(TableGradient::kKeysFieldNumber, keys);
      out.Bytes(g.keys.slice);
    }
    if (values > 0) {
      out.Field(TableGradient::kValuesFieldNumber, values);
      out.Bytes(g.values.slice);
    }
  }
  *buffer = out.Finish();
  *own_buffer = true;
  return Status::OK;
}

Status SerializationTraits<hetps::PullSparseCall, void>::Serialize(
    const hetps::PullSparseCall& call, ByteBuffer* buffer, bool* own_buffer) {
  *buffer = hetps::SerializeWithBytesField(
      call.message, hetps::rpc::PullSparseRequest::kKeysFieldNumber,
      call.keys.slice);
  *own_buffer = true;
  return Status::OK;
}

Status SerializationTraits<hetps::PulledRows, void>::Deserialize(
    ByteBuffer* buffer, hetps::PulledRows* answer) {
  const size_t row_bytes = answer->dim * sizeof(float);
  const std::span<const uint32_t> positions = answer->positions;
  const size_t expected = positions.size() * row_bytes;
  bool seen = false;
  auto take = [&](uint32_t length,
                  google::protobuf::io::CodedInputStream& in) -> Status {
    if (seen || length != expected) {
      return Status(
          StatusCode::INTERNAL,
          absl::StrCat("the reply has ", length, " bytes of rows for ",
                       positions.size(), " rows of dim ", answer->dim));
    }
    seen = true;
    const Status cut_short(StatusCode::INTERNAL,
                           "the reply's rows are cut short");
    // The rows are copied out of gRPC's buffers a buffer at a time (all of
    // a buffer's rows at once when their positions are consecutive); a row
    // across two buffers is read whole.
    for (size_t i = 0; i < positions.size();) {
      const void* data = nullptr;
      int size = 0;
      if (!in.GetDirectBufferPointer(&data, &size)) return cut_short;
      const size_t whole =
          std::min(static_cast<size_t>(size) / row_bytes, positions.size() - i);
      if (whole == 0) {
        if (!in.ReadRaw(&answer->rows[positions[i] * answer->dim],
                        static_cast<int>(row_bytes))) {
          return cut_short;
        }
        ++i;
        continue;
      }
      const auto* src = static_cast<const char*>(data);
      hetps::ForEachRun(positions.subspan(i, whole),
                        [&](size_t j, uint32_t pos, size_t n) {
                          std::memcpy(&answer->rows[pos * answer->dim],
                                      src + j * row_bytes, n * row_bytes);
                        });
      in.Skip(static_cast<int>(whole * row_bytes));
      i += whole;
    }
    return Status::OK;
  };
  if (Status s = hetps::ParseWithBytesField(
          buffer, &answer->message,
          hetps::rpc::PullSparseResponse::kValuesFieldNumber, take,
          Status(StatusCode::INTERNAL,
                 "the reply is not a PullSparseResponse"));
      !s.ok()) {
    return s;
  }
  if (!seen && expected > 0) {
    return Status(StatusCode::INTERNAL,
                  absl::StrCat("the reply has no rows for ", positions.size(),
                               " rows of dim ", answer->dim));
  }
  return Status::OK;
}

}  // namespace grpc
