#include "common/channel.h"

#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>

#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hetps {
namespace {

int ClampToInt(uint64_t bytes) {
  return static_cast<int>(std::min<uint64_t>(bytes, INT_MAX));
}

std::string BearerValue(const std::string& token) {
  return absl::StrCat("Bearer ", token);
}

// ---------------------------------------------------------------------------
// Client side. The token travels as plain metadata added by an interceptor
// rather than as gRPC call credentials: gRPC drops call credentials on a
// plaintext channel, and a token without TLS is a supported (if weaker)
// set-up.

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string value) : value_(std::move(value)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationHeader, value_);
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string value)
      : value_(std::move(value)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(value_);
  }

 private:
  const std::string value_;
};

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const Credentials& credentials) {
  if (credentials.ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = credentials.ca_pem;
  options.pem_private_key = credentials.client_key_pem;
  options.pem_cert_chain = credentials.client_cert_pem;
  return grpc::SslCredentials(options);
}

// ---------------------------------------------------------------------------
// Server side. The token is checked by an auth metadata processor, which
// gRPC runs on every call before the call reaches a handler. The C++ API
// cannot attach one to a plaintext port (InsecureServerCredentials refuses
// it), so the port is added through the C API, whose insecure and SSL
// credentials both take a processor.

// True when `given` equals `expected`, in a time that depends on the lengths
// only, so that a caller cannot find the token a byte at a time.
bool SameSecret(absl::string_view given, absl::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i]) ^
            static_cast<unsigned char>(expected[i % expected.size()]);
  }
  return diff == 0;
}

absl::string_view View(const grpc_slice& slice) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
      GRPC_SLICE_LENGTH(slice));
}

// grpc_auth_metadata_processor.process; `state` is the expected header
// value. Answers synchronously: the check never blocks.
void CheckToken(void* state, grpc_auth_context*, const grpc_metadata* md,
                size_t num_md, grpc_process_auth_metadata_done_cb done,
                void* user_data) {
  const std::string& expected = *static_cast<const std::string*>(state);
  const grpc_metadata* header = nullptr;
  for (size_t i = 0; i < num_md && header == nullptr; ++i) {
    if (View(md[i].key) == kAuthorizationHeader) header = &md[i];
  }
  if (header == nullptr) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         "missing token: this job requires one (auth.token_file or "
         "auth.token_env)");
  } else if (!SameSecret(View(header->value), expected)) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         "wrong token");
  } else {
    // Consumed: the header is taken off the call, so no handler sees it.
    done(user_data, header, 1, nullptr, 0, GRPC_STATUS_OK, nullptr);
  }
}

void DeleteExpected(void* state) { delete static_cast<std::string*>(state); }

class JobServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit JobServerCredentials(Credentials credentials)
      : credentials_(std::move(credentials)) {}

  // The token check is built in; another processor would replace it.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  // Called by grpc::Server while it starts; returns the bound port or 0.
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = nullptr;
    if (credentials_.ca_pem.empty()) {
      creds = grpc_insecure_server_credentials_create();
    } else {
      grpc_ssl_pem_key_cert_pair pair{credentials_.key_pem.c_str(),
                                      credentials_.cert_pem.c_str()};
      creds = grpc_ssl_server_credentials_create_ex(
          credentials_.require_client_cert ? credentials_.ca_pem.c_str()
                                           : nullptr,
          &pair, 1,
          credentials_.require_client_cert
              ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
              : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          nullptr);
    }
    if (creds == nullptr) return 0;
    if (!credentials_.token.empty()) {
      grpc_server_credentials_set_auth_metadata_processor(
          creds, grpc_auth_metadata_processor{
                     CheckToken, DeleteExpected,
                     new std::string(BearerValue(credentials_.token))});
    }
    // The server keeps its own reference.
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  const Credentials credentials_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           uint64_t max_message_bytes,
                                           const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(ClampToInt(max_message_bytes));
  args.SetMaxSendMessageSize(ClampToInt(max_message_bytes));
  // Reconnect attempts 100 ms apart, doubling to 1 s: a restarted server is
  // found fast. gRPC reads the "min reconnect backoff" as the least time a
  // connection attempt gets (TCP plus the HTTP/2 SETTINGS exchange): at
  // 100 ms, new connections to a busy server (a sanitized build on two
  // loaded cores) failed with "connection attempt timed out before
  // receiving SETTINGS frame"; 2 s leaves room and still ends an attempt
  // at a silent host soon.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  if (!credentials.token.empty()) {
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(
        BearerValue(credentials.token)));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      endpoint, ChannelCredentialsFor(credentials), args,
      std::move(interceptors));
}

void ConfigureServerBuilder(grpc::ServerBuilder& builder,
                            const std::string& listen_address,
                            uint64_t max_message_bytes,
                            const Credentials& credentials, int* port) {
  builder.SetMaxReceiveMessageSize(ClampToInt(max_message_bytes));
  builder.SetMaxSendMessageSize(ClampToInt(max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen_address,
                           std::make_shared<JobServerCredentials>(credentials),
                           port);
}

ParameterServerStubs GrpcParameterServerStubs(uint64_t max_message_bytes,
                                              const Credentials& credentials) {
  return [max_message_bytes, credentials](const std::string& endpoint)
             -> std::unique_ptr<rpc::ParameterServer::StubInterface> {
    return rpc::ParameterServer::NewStub(
        MakeChannel(endpoint, max_message_bytes, credentials));
  };
}

PsClientStubs GrpcPsClientStubs(uint64_t max_message_bytes,
                                const Credentials& credentials) {
  return [max_message_bytes, credentials](const std::string& endpoint) {
    auto channel = MakeChannel(endpoint, max_message_bytes, credentials);
    return PsClientStub{.stub = rpc::ParameterServer::NewStub(channel),
                        .tensors = GrpcTensorCalls(channel)};
  };
}

CoordinatorStubs GrpcCoordinatorStubs(uint64_t max_message_bytes,
                                      const Credentials& credentials) {
  return [max_message_bytes, credentials](const std::string& endpoint)
             -> std::unique_ptr<rpc::Coordinator::StubInterface> {
    return rpc::Coordinator::NewStub(
        MakeChannel(endpoint, max_message_bytes, credentials));
  };
}

}  // namespace hetps
