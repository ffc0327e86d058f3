#include "common/channel.h"

#include <algorithm>
#include <climits>

namespace hetps {
namespace {

int ClampToInt(uint64_t bytes) {
  return static_cast<int>(std::min<uint64_t>(bytes, INT_MAX));
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           uint64_t max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(ClampToInt(max_message_bytes));
  args.SetMaxSendMessageSize(ClampToInt(max_message_bytes));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(),
                                   args);
}

void ConfigureServerBuilder(grpc::ServerBuilder& builder,
                            uint64_t max_message_bytes) {
  builder.SetMaxReceiveMessageSize(ClampToInt(max_message_bytes));
  builder.SetMaxSendMessageSize(ClampToInt(max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

}  // namespace hetps
