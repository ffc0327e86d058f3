#include "server/ps_service.h"

#include <utility>

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
grpc::ServerUnaryReactor* PsService::Pull(
    grpc::CallbackServerContext* context, const Request* request,
    Response* response,
    void (PsServer::*pull)(grpc::ServerContextBase*, const Request*, Response*,
                           PsServer::Done)) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto start = [this, context, request, response, reactor, pull] {
    (server_->*pull)(context, request, response,
                     [reactor](grpc::Status s) { reactor->Finish(s); });
  };
  if (server_->RunsInline()) {
    PsServer::NoBlockingScope no_blocking;
    start();
  } else {
    blocking_.Run(std::move(start));
  }
  return reactor;
}

grpc::ServerUnaryReactor* PsService::PullSparse(
    grpc::CallbackServerContext* context, const rpc::PullSparseRequest* request,
    rpc::PullSparseResponse* response) {
  return Pull(context, request, response, &PsServer::PullSparse);
}

grpc::ServerUnaryReactor* PsService::PullDense(
    grpc::CallbackServerContext* context, const rpc::PullDenseRequest* request,
    rpc::PullDenseResponse* response) {
  return Pull(context, request, response, &PsServer::PullDense);
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* context,
                                          const rpc::PushRequest* request,
                                          rpc::PushResponse* response) {
  return Run(context, server_->RunsInline(),
             [=, this] { return server_->Push(context, request, response); });
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
