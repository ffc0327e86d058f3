#include "server/ps_service.h"

#include <memory>
#include <utility>

#include "common/slices.h"

namespace hetps {

PsService::PsService(PsServer* server) : server_(server) {}

template <typename Handle>
grpc::ServerUnaryReactor* PsService::Run(grpc::CallbackServerContext* context,
                                         bool inline_ok, Handle handle) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (inline_ok) {
    PsServer::NoBlockingScope no_blocking;
    reactor->Finish(handle());
  } else {
    blocking_.Run([reactor, handle = std::move(handle)]() mutable {
      reactor->Finish(handle());
    });
  }
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
  if (server_->RunsInline()) {
    PsServer::NoBlockingScope no_blocking;
    start();
  } else {
    blocking_.Run(std::move(start));
  }
}

grpc::ServerUnaryReactor* PsService::PullSparse(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  struct Call {
    rpc::PullSparseRequest request;
    PullSparseReply reply;
  };
  auto call = std::make_shared<Call>();
  grpc::ByteBuffer bytes = *request;  // shares the slices: parsing takes them
  if (!grpc::SerializationTraits<rpc::PullSparseRequest>::Deserialize(
           &bytes, &call->request)
           .ok()) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "pull: the request is not a PullSparseRequest"));
    return reactor;
  }
  Pull(context, &call->request, &call->reply, &PsServer::PullSparse,
       [reactor, response, call](grpc::Status s) {
         if (s.ok()) {
           *response = SerializeWithBytesField(
               call->reply.message, rpc::PullSparseResponse::kValuesFieldNumber,
               std::move(call->reply.rows.slice));
         }
         reactor->Finish(s);
       });
  return reactor;
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
  auto push = std::make_shared<ReceivedPush>();
  grpc::ByteBuffer bytes = *request;  // shares the slices: parsing takes them
  if (grpc::Status parsed = ParsePush(&bytes, push.get()); !parsed.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(parsed);
    return reactor;
  }
  return Run(context, server_->RunsInline(), [=, this] {
    rpc::PushResponse answer;
    grpc::Status status = server_->Push(context, *push, &answer);
    if (status.ok()) {
      bool own_buffer;
      status = grpc::SerializationTraits<rpc::PushResponse>::Serialize(
          answer, response, &own_buffer);
    }
    return status;
  });
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
