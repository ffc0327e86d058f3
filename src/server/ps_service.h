// PsService: the ParameterServer gRPC service, on gRPC's callback API, in
// front of a PsServer. gRPC's callback threads are few and must not block,
// so a request runs on them only when PsServer::RunsInline says it cannot
// block there, and under a PsServer::NoBlockingScope (a move that begins
// meanwhile gets it refused with UNAVAILABLE, which the client retries);
// otherwise (a bucket move in progress, an emulated slower machine) it runs
// on this service's own threads, which may. Requests that
// block by nature (Save, the moves' PrepareMove, AdoptShardMap, HandOver,
// TakeOver) always run there. A pull that waits for its round or the SSP
// bound holds no thread at all (PsServer::PullSparse).
//
// A client's TensorStream (common/tensor_calls.h) carries its small Push
// and PullSparse calls as frames: each is handled as its unary call would
// be, and its answer written back when ready, in any order.
//
// Thread-safety: gRPC calls the handlers concurrently. Outlives the
// grpc::Server it is registered with (that server's Shutdown waits for the
// requests running here); CloseStreams before that Shutdown, which would
// otherwise wait out its deadline for the streams clients keep open.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/task_pool.h"
#include "hetps.grpc.pb.h"
#include "server/ps_server.h"

namespace hetps {

namespace ps_service_internal {
using Api = rpc::ParameterServer;
// Every method on the callback API, PullSparse and Push raw. Spelled out,
// not layered over CallbackService: a raw method over its typed callback
// one hides that (clang's -Woverloaded-virtual). A method missing here
// answers UNIMPLEMENTED, and its handler below fails to compile.
using Base =
    Api::WithRawCallbackMethod_PullSparse<Api::WithCallbackMethod_PullDense<
        Api::WithRawCallbackMethod_Push<Api::WithRawCallbackMethod_TensorStream<
            Api::WithCallbackMethod_GetTableInfo<
                Api::WithCallbackMethod_UpdateMembership<
                    Api::WithCallbackMethod_Save<
                        Api::WithCallbackMethod_PrepareMove<
                            Api::WithCallbackMethod_AdoptShardMap<
                                Api::WithCallbackMethod_HandOver<
                                    Api::WithCallbackMethod_TakeOver<
                                        Api::Service>>>>>>>>>>>;
}  // namespace ps_service_internal

class PsService final : public ps_service_internal::Base {
 public:
  // `server` must outlive this.
  explicit PsService(PsServer* server);
  // Waits for gRPC to be done with every stream (their OnDone may come
  // after the server's Shutdown has returned).
  ~PsService() override;

  // Raw: the request is parsed here, and the reply's rows go out in the
  // slice the server wrote them into (PullSparseReply).
  grpc::ServerUnaryReactor* PullSparse(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PullDense(
      grpc::CallbackServerContext* context,
      const rpc::PullDenseRequest* request,
      rpc::PullDenseResponse* response) override;
  // Raw: a push's keys and values are copied once out of gRPC's buffers,
  // its values checked for NaN/Inf on the way (ParsePush).
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // Raw: frames of Push and PullSparse calls (TensorFrame).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TensorStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetTableInfo(
      grpc::CallbackServerContext* context,
      const rpc::TableInfoRequest* request,
      rpc::TableInfoResponse* response) override;
  grpc::ServerUnaryReactor* UpdateMembership(
      grpc::CallbackServerContext* context,
      const rpc::MembershipUpdate* request,
      rpc::MembershipAck* response) override;
  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* context,
                                 const rpc::SaveRequest* request,
                                 rpc::SaveResponse* response) override;
  grpc::ServerUnaryReactor* PrepareMove(
      grpc::CallbackServerContext* context,
      const rpc::PrepareMoveRequest* request,
      rpc::PrepareMoveResponse* response) override;
  grpc::ServerUnaryReactor* AdoptShardMap(
      grpc::CallbackServerContext* context,
      const rpc::AdoptShardMapRequest* request,
      rpc::AdoptShardMapResponse* response) override;
  grpc::ServerUnaryReactor* HandOver(grpc::CallbackServerContext* context,
                                     const rpc::HandOverRequest* request,
                                     rpc::MovedRows* response) override;
  grpc::ServerUnaryReactor* TakeOver(grpc::CallbackServerContext* context,
                                     const rpc::TakeOverRequest* request,
                                     rpc::TakeOverResponse* response) override;

  // Threads that ran requests which could block, alive now.
  size_t blocking_threads() const { return blocking_.threads(); }

  // TensorStreams open now, and the calls they have carried.
  size_t open_streams() const ABSL_LOCKS_EXCLUDED(streams_mu_) {
    absl::MutexLock lock(&streams_mu_);
    return streams_.size();
  }
  uint64_t stream_calls() const {
    return stream_calls_.load(std::memory_order_relaxed);
  }

  // Ends every TensorStream (UNAVAILABLE: their clients call again, once
  // this server is back) and refuses new ones. Calls still running finish;
  // their answers are dropped.
  void CloseStreams();

 private:
  class StreamReactor;
  // A call's answer: its status and, when OK, the reply's wire form.
  using Answer = std::function<void(grpc::Status, grpc::ByteBuffer)>;

  // The handling shared by a unary call and a frame: `request` is the
  // request's wire form (consumed), `context` the call's or the stream's.
  //
  // A frame's push handled inline may be answered before its apply ends
  // (PsServer::Push's `answer_early`): the stream reads its next frame only
  // once the handler has returned, so that frame meets the applied rows,
  // and the stream stays open, holding a shutdown back, until then. A
  // unary call answers after the apply: once answered it is over, and
  // nothing would hold the server back for the rest of its handler. So
  // does a frame handed off the stream's thread (a paced or moving server).
  void HandlePush(grpc::CallbackServerContext* context,
                  grpc::ByteBuffer* request, bool on_stream, Answer answer);
  void HandlePullSparse(grpc::CallbackServerContext* context,
                        grpc::ByteBuffer* request, Answer answer);
  // A raw unary call: `handle` answers it.
  using Handler = std::function<void(grpc::CallbackServerContext*,
                                     grpc::ByteBuffer*, Answer)>;
  grpc::ServerUnaryReactor* RawUnary(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response,
                                     Handler handle);
  // A stream gone (its OnDone).
  void Forget(StreamReactor* stream);

  // Runs `fn` on this thread, under a PsServer::NoBlockingScope, when
  // `inline_ok`, else on blocking_.
  template <typename Fn>
  void Dispatch(bool inline_ok, Fn fn);
  // Runs `handle` (returning the grpc::Status) as Dispatch does, and
  // finishes the call with its status.
  template <typename Handle>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* context,
                                bool inline_ok, Handle handle);
  // A pull, started as Dispatch does when the server runs requests inline;
  // `done` receives the server's answer.
  template <typename Request, typename Response>
  void Pull(grpc::CallbackServerContext* context, const Request* request,
            Response* response,
            void (PsServer::*pull)(grpc::ServerContextBase*, const Request*,
                                   Response*, PsServer::Done),
            PsServer::Done done);

  PsServer* const server_;
  // Unbounded: requests held by a move wait for other requests (TakeOver,
  // AdoptShardMap) that a bound could keep out.
  TaskPool blocking_{"ps-blocking", TaskPool::kUnbounded};

  std::atomic<uint64_t> stream_calls_{0};
  mutable absl::Mutex streams_mu_;
  bool closing_ ABSL_GUARDED_BY(streams_mu_) = false;
  absl::flat_hash_set<StreamReactor*> streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace hetps
