#include "server/server_node.h"

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/logging.h"

namespace hetps {

absl::StatusOr<std::unique_ptr<ServerNode>> ServerNode::Start(
    const JobConfig& config, uint32_t rank, const std::string& listen_address) {
  std::unique_ptr<ServerNode> node(new ServerNode());
  auto ps = PsServer::Create(config, rank);
  if (!ps.ok()) return ps.status();
  node->ps_ = std::move(*ps);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder, listen_address,
                         config.server.max_message_bytes, config.credentials,
                         &node->port_);
  builder.RegisterService(node->ps_.get());
  if (rank == 0) {
    node->coordinator_ = std::make_unique<Coordinator>(config);
    builder.RegisterService(node->coordinator_.get());
  }
  node->server_ = builder.BuildAndStart();
  if (node->server_ == nullptr || node->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "server ", rank, ": cannot listen on ", listen_address,
        " (address in use or not local?",
        config.credentials.ca_pem.empty() ? "" : " TLS certificate or key bad?",
        ")"));
  }
  if (node->coordinator_) node->coordinator_->Start();
  spdlog::info("server {} serving {} tables in {} mode{}", rank,
               config.tables.size(), ConsistencyModeName(config.mode),
               rank == 0 ? ", coordinator here" : "");
  return node;
}

ServerNode::~ServerNode() { Shutdown(absl::Seconds(2)); }

void ServerNode::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  // Wake barriers first so that their handlers can finish.
  if (coordinator_) coordinator_->Stop();
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
}

}  // namespace hetps
