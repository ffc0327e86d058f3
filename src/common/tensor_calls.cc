#include "common/tensor_calls.h"

#include <grpcpp/alarm.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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

const std::string& TensorStreamMethod() {
  static const std::string* name =
      new std::string("/hetps.rpc.ParameterServer/TensorStream");
  return *name;
}

using Clock = std::chrono::system_clock;

// The calls on one TensorStream. Lives until gRPC is done with the stream
// (OnDone) and no one holds it.
class CallStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public std::enable_shared_from_this<CallStream> {
 public:
  // Where a call's answer goes.
  struct Answer {
    rpc::PushResponse* pushed = nullptr;  // a push's
    PulledRows* pulled = nullptr;         // a pull's
    TensorCalls::Done done;
    Clock::time_point deadline;
  };

  static std::shared_ptr<CallStream> Open(
      grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>& stub) {
    std::shared_ptr<CallStream> stream(new CallStream());
    stream->self_ = stream;
    stub.PrepareBidiStreamingCall(&stream->context_, TensorStreamMethod(),
                                  grpc::StubOptions(), stream.get());
    stream->AddHold();  // until the reads end (ReadsEnded)
    stream->StartRead(&stream->in_);
    stream->StartCall();
    return stream;
  }

  // Sends a call of `kind` with request `body`; its answer goes to
  // `answer`. False when the stream has ended: the call was not sent,
  // and `answer.done` not called.
  bool Call(rpc::TensorFrame::Kind kind, const grpc::ByteBuffer& body,
            Answer& answer) {
    rpc::TensorFrame header;
    header.set_id(next_id_.fetch_add(1, std::memory_order_relaxed));
    header.set_kind(kind);
    grpc::ByteBuffer frame = WriteFrame(header, body);
    const grpc::ByteBuffer* write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return false;
      // (alarm_at_ is the far future while no alarm is set, as is a call
      // without a deadline.)
      if (answer.deadline < alarm_at_) ArmAlarm(answer.deadline);
      pending_.emplace(header.id(), std::move(answer));
      queue_.push_back(std::move(frame));
      if (!writing_) {
        writing_ = true;
        write = &queue_.front();
        ++starting_;
      }
    }
    if (write == nullptr) return true;
    StartWrite(write);
    bool release;
    {
      absl::MutexLock lock(&mu_);
      --starting_;
      release = Releasable();
    }
    if (release) RemoveHold();
    return true;
  }

  bool ended() const {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

  // Ends the stream (its calls in flight fail) and waits until gRPC is
  // done with it. The caller holds the last reference then, so the stream
  // (its context, which may hold the channel's last reference) goes on
  // the caller's thread: a channel that goes on one of gRPC's callback
  // threads cannot join that thread.
  void Close() {
    const std::shared_ptr<absl::Notification> gone = gone_;
    context_.TryCancel();
    gone->WaitForNotification();
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        // The stream is ending: OnDone fails the calls.
        queue_.clear();
      } else if (!queue_.empty()) {
        next = &queue_.front();
      }
      writing_ = next != nullptr;
    }
    if (next != nullptr) StartWrite(next);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return ReadsEnded();  // OnDone follows
    grpc::ByteBuffer frame;
    frame.Swap(&in_);  // (ByteBuffer has no move)
    rpc::TensorFrame header;
    grpc::ByteBuffer body;
    if (!ReadFrame(&frame, &header, &body).ok()) {
      // Not a frame: the server is not one this client can talk to.
      {
        absl::MutexLock lock(&mu_);
        end_status_ =
            grpc::Status(grpc::StatusCode::INTERNAL,
                         "the server's TensorStream sent a malformed frame");
      }
      context_.TryCancel();
      return ReadsEnded();
    }
    StartRead(&in_);
    std::optional<Answer> answer = Take(header.id());
    if (!answer) return;  // past its deadline, already failed
    grpc::Status status(static_cast<grpc::StatusCode>(header.code()),
                        header.error());
    if (status.ok()) {
      status = answer->pushed != nullptr
                   ? grpc::SerializationTraits<rpc::PushResponse>::Deserialize(
                         &body, answer->pushed)
                   : grpc::SerializationTraits<PulledRows>::Deserialize(
                         &body, answer->pulled);
    }
    answer->done(std::move(status));
  }

  void OnDone(const grpc::Status& status) override {
    absl::flat_hash_map<uint64_t, Answer> failed;
    grpc::Status why;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      failed.swap(pending_);
      why = end_status_.ok() ? status : end_status_;
      alarm_.reset();
    }
    // A stream that broke or was cancelled fails its calls as unavailable,
    // which callers retry; a status the server ended it with is theirs.
    if (why.ok() || why.error_code() == grpc::StatusCode::CANCELLED) {
      why = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         absl::StrCat("the TensorStream to the server ended",
                                      why.error_message().empty() ? "" : ": ",
                                      why.error_message()));
    }
    for (auto& [id, answer] : failed) answer.done(why);
    const std::shared_ptr<absl::Notification> gone = gone_;
    self_.reset();  // may delete this
    gone->Notify();
  }

 private:
  CallStream() = default;

  // The stream's hold (AddHold in Open) keeps gRPC from calling OnDone,
  // and freeing the call, while a caller's thread starts a write; it goes
  // once the reads have ended (the stream is ending: no call is sent on it
  // any more) and no such write is being started.
  void ReadsEnded() ABSL_LOCKS_EXCLUDED(mu_) {
    bool release;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      release = Releasable();
    }
    if (release) RemoveHold();
  }
  bool Releasable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ended_ || starting_ > 0 || released_) return false;
    released_ = true;
    return true;
  }

  std::optional<Answer> Take(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return std::nullopt;
    Answer answer = std::move(it->second);
    pending_.erase(it);
    return answer;
  }

  // One alarm for the earliest deadline of the calls in flight: a call
  // does not set one of its own (calls share a timeout, so a new call's
  // deadline is rarely the earliest).
  void ArmAlarm(Clock::time_point at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    alarm_at_ = at;
    alarm_ = std::make_unique<grpc::Alarm>();  // cancels the one before
    alarm_->Set(at, [weak = weak_from_this()](bool fired) {
      if (!fired) return;
      if (auto stream = weak.lock()) stream->FailLateCalls();
    });
  }

  // Fails the calls past their deadline; arms the alarm for the next.
  void FailLateCalls() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Answer> late;
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      const Clock::time_point now = Clock::now();
      Clock::time_point next = Clock::time_point::max();
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.deadline <= now) {
          late.push_back(std::move(it->second));
          pending_.erase(it++);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      if (next != Clock::time_point::max()) {
        ArmAlarm(next);  // this alarm's object goes: gRPC allows it
      } else {
        alarm_at_ = Clock::time_point::max();
      }
    }
    for (Answer& answer : late) {
      answer.done(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "Deadline Exceeded"));
    }
  }

  grpc::ClientContext context_;
  grpc::ByteBuffer in_;
  std::atomic<uint64_t> next_id_{0};
  // Notified once OnDone has let go of the stream.
  const std::shared_ptr<absl::Notification> gone_ =
      std::make_shared<absl::Notification>();
  std::shared_ptr<CallStream> self_;  // until OnDone

  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Answer> pending_ ABSL_GUARDED_BY(mu_);
  // Frames to write, the front one being written when `writing_`.
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;       // writes a caller is starting
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // the hold
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  Clock::time_point alarm_at_ ABSL_GUARDED_BY(mu_) = Clock::time_point::max();
};

size_t TensorBytes(const PushCall& call) {
  size_t bytes = 0;
  for (const PushCall::Gradient& g : call.gradients) {
    bytes += g.keys.slice.size() + g.values.slice.size();
  }
  return bytes;
}

class GrpcCalls final : public TensorCalls {
 public:
  explicit GrpcCalls(std::shared_ptr<grpc::ChannelInterface> channel)
      : push_(channel), pull_(channel), frames_(channel) {}

  ~GrpcCalls() override {
    std::shared_ptr<CallStream> stream;
    {
      absl::MutexLock lock(&mu_);
      stream = std::move(stream_);
    }
    if (stream) stream->Close();
  }

  void Push(grpc::ClientContext* context, const PushCall* call,
            rpc::PushResponse* response, Done done) override {
    if (TensorBytes(*call) > kStreamMaxTensorBytes) {
      push_.UnaryCall(context, PushMethod(), grpc::StubOptions(), call,
                      response, std::move(done));
      return;
    }
    grpc::ByteBuffer body;
    bool own;
    (void)grpc::SerializationTraits<PushCall>::Serialize(*call, &body, &own);
    OnStream(rpc::TensorFrame::PUSH, body,
             CallStream::Answer{.pushed = response,
                                .done = std::move(done),
                                .deadline = context->deadline()});
  }

  void PullSparse(grpc::ClientContext* context, const PullSparseCall* call,
                  PulledRows* answer, Done done) override {
    if (std::max(call->keys.slice.size(),
                 answer->positions.size() * answer->dim * sizeof(float)) >
        kStreamMaxTensorBytes) {
      pull_.UnaryCall(context, PullSparseMethod(), grpc::StubOptions(), call,
                      answer, std::move(done));
      return;
    }
    grpc::ByteBuffer body;
    bool own;
    (void)grpc::SerializationTraits<PullSparseCall>::Serialize(*call, &body,
                                                               &own);
    OnStream(rpc::TensorFrame::PULL_SPARSE, body,
             CallStream::Answer{.pulled = answer,
                                .done = std::move(done),
                                .deadline = context->deadline()});
  }

 private:
  void OnStream(rpc::TensorFrame::Kind kind, const grpc::ByteBuffer& body,
                CallStream::Answer answer) {
    std::shared_ptr<CallStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (!stream_ || stream_->ended()) stream_ = CallStream::Open(frames_);
      stream = stream_;
    }
    if (!stream->Call(kind, body, answer)) {
      // It ended meanwhile: as a call on a broken connection would.
      answer.done(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the TensorStream to the server ended"));
    }
  }

  grpc::TemplatedGenericStub<PushCall, rpc::PushResponse> push_;
  grpc::TemplatedGenericStub<PullSparseCall, PulledRows> pull_;
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> frames_;
  absl::Mutex mu_;
  std::shared_ptr<CallStream> stream_ ABSL_GUARDED_BY(mu_);
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
  // A message inside the push: a level of the depth protobuf allows the
  // groups in it.
  if (!in.IncrementRecursionDepth()) return false;
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
  in.DecrementRecursionDepth();
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

grpc::ByteBuffer WriteFrame(const rpc::TensorFrame& header,
                            const grpc::ByteBuffer& body) {
  WireWriter out;
  out.Append(header);
  const size_t length = body.Length();
  if (length > 0) {
    out.Field(rpc::TensorFrame::kBodyFieldNumber, length);
    std::vector<grpc::Slice> slices;
    (void)body.Dump(&slices);
    for (grpc::Slice& slice : slices) out.Bytes(std::move(slice));
  }
  return out.Finish();
}

grpc::Status ReadFrame(grpc::ByteBuffer* frame, rpc::TensorFrame* header,
                       grpc::ByteBuffer* body) {
  const grpc::Status malformed(grpc::StatusCode::INVALID_ARGUMENT,
                               "the frame is not a TensorFrame");
  std::vector<grpc::Slice> slices;
  if (!frame->Dump(&slices).ok()) return malformed;
  size_t at = 0;
  size_t length = 0;
  if (grpc::Status s = ParseWithBytesField(
          frame, header, rpc::TensorFrame::kBodyFieldNumber,
          [&](uint32_t size, google::protobuf::io::CodedInputStream& in) {
            at = static_cast<size_t>(in.CurrentPosition());
            length = size;
            return in.Skip(static_cast<int>(size)) ? grpc::Status::OK
                                                   : malformed;
          },
          malformed);
      !s.ok()) {
    return s;
  }
  // The body: bytes [at, at + length) of the frame, in its own slices.
  std::vector<grpc::Slice> parts;
  size_t offset = 0;
  for (const grpc::Slice& slice : slices) {
    const size_t begin = std::max(at, offset);
    const size_t end = std::min(at + length, offset + slice.size());
    if (begin < end) parts.push_back(slice.sub(begin - offset, end - offset));
    offset += slice.size();
  }
  *body = grpc::ByteBuffer(parts.data(), parts.size());
  return grpc::Status::OK;
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
