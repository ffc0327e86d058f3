#include "server/ps_service.h"

#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/slices.h"
#include "common/tensor_calls.h"

namespace hetps {

PsService::PsService(PsServer* server) : server_(server) {}

PsService::~PsService() {
  absl::MutexLock lock(&streams_mu_);
  streams_mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<StreamReactor*>* open) { return open->empty(); },
      &streams_));
}

template <typename Fn>
void PsService::Dispatch(bool inline_ok, Fn fn) {
  if (inline_ok) {
    PsServer::NoBlockingScope no_blocking;
    fn();
  } else {
    blocking_.Run(std::move(fn));
  }
}

template <typename Handle>
grpc::ServerUnaryReactor* PsService::Run(grpc::CallbackServerContext* context,
                                         bool inline_ok, Handle handle) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Dispatch(inline_ok, [reactor, handle = std::move(handle)]() mutable {
    reactor->Finish(handle());
  });
  return reactor;
}

template <typename Request, typename Response>
void PsService::Pull(grpc::CallbackServerContext* context,
                     const Request* request, Response* response,
                     void (PsServer::*pull)(grpc::ServerContextBase*,
                                            const Request*, Response*,
                                            PsServer::Done),
                     PsServer::Done done) {
  auto start = [this, context, request, response, pull,
                done = std::move(done)]() mutable {
    (server_->*pull)(context, request, response, std::move(done));
  };
  Dispatch(server_->RunsInline(), std::move(start));
}

void PsService::HandlePullSparse(grpc::CallbackServerContext* context,
                                 grpc::ByteBuffer* request, Answer answer) {
  struct Call {
    rpc::PullSparseRequest request;
    PullSparseReply reply;
  };
  auto call = std::make_shared<Call>();
  if (!grpc::SerializationTraits<rpc::PullSparseRequest>::Deserialize(
           request, &call->request)
           .ok()) {
    answer(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "pull: the request is not a PullSparseRequest"),
           {});
    return;
  }
  Pull(context, &call->request, &call->reply, &PsServer::PullSparse,
       [answer = std::move(answer), call](grpc::Status s) {
         grpc::ByteBuffer reply;
         if (s.ok()) {
           reply = SerializeWithBytesField(
               call->reply.message, rpc::PullSparseResponse::kValuesFieldNumber,
               std::move(call->reply.rows.slice));
         }
         answer(std::move(s), std::move(reply));
       });
}

void PsService::HandlePush(grpc::CallbackServerContext* context,
                           grpc::ByteBuffer* request, bool on_stream,
                           Answer answer) {
  auto push = std::make_shared<ReceivedPush>();
  if (grpc::Status parsed = ParsePush(request, push.get()); !parsed.ok()) {
    answer(std::move(parsed), {});
    return;
  }
  const bool inline_ok = server_->RunsInline();
  const bool early = on_stream && inline_ok;
  auto handle = [this, context, push, early, answer = std::move(answer)] {
    rpc::PushResponse reply;
    auto send = [&](grpc::Status status) {
      grpc::ByteBuffer bytes;
      if (status.ok()) {
        bool own_buffer;
        status = grpc::SerializationTraits<rpc::PushResponse>::Serialize(
            reply, &bytes, &own_buffer);
      }
      answer(std::move(status), std::move(bytes));
    };
    bool answered = false;
    std::function<void()> answer_early;
    if (early) {
      answer_early = [&] {
        send(grpc::Status::OK);
        answered = true;
      };
    }
    grpc::Status status = server_->Push(context, *push, &reply, answer_early);
    if (!answered) send(std::move(status));
  };
  Dispatch(inline_ok, std::move(handle));
}

grpc::ServerUnaryReactor* PsService::RawUnary(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response, Handler handle) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::ByteBuffer bytes = *request;  // shares the slices: parsing takes them
  handle(context, &bytes,
         [reactor, response](grpc::Status s, grpc::ByteBuffer reply) {
           if (s.ok()) *response = std::move(reply);
           reactor->Finish(s);
         });
  return reactor;
}

grpc::ServerUnaryReactor* PsService::PullSparse(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RawUnary(context, request, response,
                  [this](grpc::CallbackServerContext* c, grpc::ByteBuffer* b,
                         Answer a) { HandlePullSparse(c, b, std::move(a)); });
}

grpc::ServerUnaryReactor* PsService::PullDense(
    grpc::CallbackServerContext* context, const rpc::PullDenseRequest* request,
    rpc::PullDenseResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Pull(context, request, response, &PsServer::PullDense,
       [reactor](grpc::Status s) { reactor->Finish(s); });
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) {
  return RawUnary(
      context, request, response,
      [this](grpc::CallbackServerContext* c, grpc::ByteBuffer* b, Answer a) {
        HandlePush(c, b, /*on_stream=*/false, std::move(a));
      });
}

// One client's TensorStream. Each frame read is a call, handled as the
// unary one (HandlePush, HandlePullSparse) while the next frame is read;
// answers are written one at a time, in the order they are ready. The
// stream is finished once no call runs and no answer is being written,
// and either the client is done sending, or it must end now (CloseStreams,
// a cancelled stream, a frame that is not one). A call still running
// holds the stream open: it may use the stream's context.
class PsService::StreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(PsService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  // Begins reading, or with `closing` ends the stream at once.
  void Start(bool closing) {
    if (closing) {
      EndNow(ShuttingDown());
    } else {
      StartRead(&in_);
    }
  }

  void EndNow(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!end_now_) end_now_ = std::move(status);
      finish = Due();
    }
    FinishIf(std::move(finish));
  }

  // References beyond gRPC's, which ends with OnDone.
  void Ref() {
    absl::MutexLock lock(&mu_);
    ++refs_;
  }
  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  static grpc::Status ShuttingDown() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down");
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::optional<grpc::Status> finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = Due();
      }
      FinishIf(std::move(finish));
      return;
    }
    grpc::ByteBuffer frame;
    frame.Swap(&in_);  // (ByteBuffer has no move)
    rpc::TensorFrame header;
    grpc::ByteBuffer body;
    if (grpc::Status s = ReadFrame(&frame, &header, &body); !s.ok()) {
      // No call to answer: the stream ends with the error.
      EndNow(std::move(s));
      return;
    }
    bool ending;
    {
      absl::MutexLock lock(&mu_);
      ending = end_now_.has_value();
      if (!ending) {
        ++calls_;  // until answered
        handing_ = true;
      }
    }
    if (ending) return;  // its client sees the stream end, and calls again
    service_->stream_calls_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t id = header.id();
    const rpc::TensorFrame::Kind kind = header.kind();
    Answer answer = [this, id, kind](grpc::Status s, grpc::ByteBuffer reply) {
      Reply(id, kind, std::move(s), std::move(reply));
    };
    switch (kind) {
      case rpc::TensorFrame::PUSH:
        service_->HandlePush(context_, &body, /*on_stream=*/true,
                             std::move(answer));
        break;
      case rpc::TensorFrame::PULL_SPARSE:
        service_->HandlePullSparse(context_, &body, std::move(answer));
        break;
      default:
        answer(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("a TensorFrame of unknown kind ",
                                         static_cast<int>(kind))),
               {});
    }
    // The next read starts once the handler is done: an answer made inline
    // is on its way by then, and HTTP/2's window update for this frame goes
    // with it. With the read started first the update went alone, and the
    // client woke for it and again for the answer (with four workers on a
    // server, small calls 13-17% slower: docs/BENCHMARKS.md section 1,
    // "gRPC's floor under a small call"). A handler that waits (a pull for
    // its round) hands the call on and returns at once, so the stream reads
    // on meanwhile.
    StartRead(&in_);
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      handing_ = false;
      finish = Due();
    }
    FinishIf(std::move(finish));
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        // The client is gone: nothing more can be written.
        queue_.clear();
        if (!end_now_) end_now_ = grpc::Status::CANCELLED;
      } else if (!queue_.empty()) {
        next = &queue_.front();
      }
      writing_ = next != nullptr;
      finish = Due();
    }
    // With a write started the stream cannot finish here (writing_); it
    // may end on another thread as soon as that write is done, so this
    // is the last use of it.
    if (next != nullptr) {
      StartWrite(next);
      return;
    }
    FinishIf(std::move(finish));
  }

  void OnCancel() override { EndNow(grpc::Status::CANCELLED); }

  void OnDone() override {
    service_->Forget(this);
    Unref();
  }

 private:
  // The status to finish the stream with, when it is due now (then it
  // counts as finished).
  std::optional<grpc::Status> Due() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_ || calls_ > 0 || handing_ ||
        (!end_now_ && !reads_done_)) {
      return std::nullopt;
    }
    finished_ = true;
    return end_now_.value_or(grpc::Status::OK);
  }
  // Finish(*status), outside the lock.
  void FinishIf(std::optional<grpc::Status> status) ABSL_LOCKS_EXCLUDED(mu_) {
    if (status) Finish(*std::move(status));
  }

  // A call's answer, written after those before it.
  void Reply(uint64_t id, rpc::TensorFrame::Kind kind, grpc::Status status,
             grpc::ByteBuffer reply) {
    rpc::TensorFrame header;
    header.set_id(id);
    header.set_kind(kind);
    if (!status.ok()) {
      header.set_code(status.error_code());
      header.set_error(status.error_message());
      reply.Clear();
    }
    grpc::ByteBuffer frame = WriteFrame(header, reply);
    const grpc::ByteBuffer* write = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      --calls_;
      // Dropped when the stream is ending.
      if (!finished_ && !end_now_) {
        queue_.push_back(std::move(frame));
        if (!writing_) {
          writing_ = true;
          write = &queue_.front();
        }
      }
      finish = Due();
    }
    // As in OnWriteDone: a started write is the last use of the stream
    // here. (A late answer, on a reader's thread, raced the stream's end
    // before: UBSan saw FinishIf called on a stream already deleted.)
    if (write != nullptr) {
      StartWrite(write);
      return;
    }
    FinishIf(std::move(finish));
  }

  PsService* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer in_;

  absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 1;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;  // handled, not yet answered
  // A frame is with its handler, and the next read not yet started: the
  // stream may not finish before that read starts.
  bool handing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_now_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Answers to write, the front one being written when `writing_`.
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
PsService::TensorStream(grpc::CallbackServerContext* context) {
  auto* stream = new StreamReactor(this, context);
  bool closing;
  {
    absl::MutexLock lock(&streams_mu_);
    closing = closing_;
    if (!closing) streams_.insert(stream);
  }
  stream->Start(closing);
  return stream;
}

void PsService::CloseStreams() {
  std::vector<StreamReactor*> open;
  {
    absl::MutexLock lock(&streams_mu_);
    closing_ = true;
    for (StreamReactor* stream : streams_) {
      stream->Ref();  // past its OnDone, until closed here
      open.push_back(stream);
    }
  }
  for (StreamReactor* stream : open) {
    stream->EndNow(StreamReactor::ShuttingDown());
    stream->Unref();
  }
}

void PsService::Forget(StreamReactor* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

grpc::ServerUnaryReactor* PsService::GetTableInfo(
    grpc::CallbackServerContext* context, const rpc::TableInfoRequest* request,
    rpc::TableInfoResponse* response) {
  return Run(context, true, [=, this] {
    return server_->GetTableInfo(context, request, response);
  });
}

grpc::ServerUnaryReactor* PsService::UpdateMembership(
    grpc::CallbackServerContext* context, const rpc::MembershipUpdate* request,
    rpc::MembershipAck* response) {
  return Run(context, true, [=, this] {
    return server_->UpdateMembership(context, request, response);
  });
}

grpc::ServerUnaryReactor* PsService::Save(grpc::CallbackServerContext* context,
                                          const rpc::SaveRequest* request,
                                          rpc::SaveResponse* response) {
  return Run(context, false,
             [=, this] { return server_->Save(context, request, response); });
}

grpc::ServerUnaryReactor* PsService::PrepareMove(
    grpc::CallbackServerContext* context,
    const rpc::PrepareMoveRequest* request,
    rpc::PrepareMoveResponse* response) {
  return Run(context, false, [=, this] {
    return server_->PrepareMove(context, request, response);
  });
}

grpc::ServerUnaryReactor* PsService::AdoptShardMap(
    grpc::CallbackServerContext* context,
    const rpc::AdoptShardMapRequest* request,
    rpc::AdoptShardMapResponse* response) {
  return Run(context, false, [=, this] {
    return server_->AdoptShardMap(context, request, response);
  });
}

grpc::ServerUnaryReactor* PsService::HandOver(
    grpc::CallbackServerContext* context, const rpc::HandOverRequest* request,
    rpc::MovedRows* response) {
  return Run(context, false, [=, this] {
    return server_->HandOver(context, request, response);
  });
}

grpc::ServerUnaryReactor* PsService::TakeOver(
    grpc::CallbackServerContext* context, const rpc::TakeOverRequest* request,
    rpc::TakeOverResponse* response) {
  return Run(context, false, [=, this] {
    return server_->TakeOver(context, request, response);
  });
}

}  // namespace hetps
