// What a call costs in gRPC itself, with no hetps code: the floor under
// push_pull_bench's small calls, by the way the client waits for its
// answer. One server process (forked first, before gRPC starts) answers
// every request with as many bytes as the request's first 4 bytes ask;
// this process calls it on 127.0.0.1 in each mode, one call at a time:
//
//   unary-callback  a unary call whose answer runs a callback on one of
//                   gRPC's threads, which wakes the caller (PsClient's
//                   large calls)
//   unary-cq        a unary call on a completion queue the caller itself
//                   polls
//   stream-callback one message each way on a long-lived bidirectional
//                   stream with a callback reactor (PsClient's small calls:
//                   the TensorStream)
//   stream-cq       the same stream on a completion queue the caller polls
//
// The server is gRPC's callback server, as `hetps server` is. With
// --callback-threads the client makes one callback call first, so that
// gRPC's callback threads run in it as they do in any hetps client; the
// queue modes then compete with them for the socket's events.
//
//   grpc_floor_bench [--modes unary-callback,unary-cq,...]
//                    [--sizes 100:8,8:100,720000:8] [--reps 2000]
//                    [--rounds 3] [--callback-threads] [--out results.json]
//
// A size is request:answer bytes. The rounds run the modes in turn (a
// round's order turning), so a machine's drift falls on all modes; the JSON
// has each round's median and p90 in µs and the median of the rounds.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/median.h"
#include "common/process_tuning.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = grpc::ByteBuffer;

constexpr char kUnary[] = "/floor/Unary";
constexpr char kStream[] = "/floor/Stream";

// A request of `size` bytes (at least 4) asking for `answer` bytes back.
Bytes Request(size_t size, uint32_t answer) {
  std::string bytes(std::max<size_t>(size, 4), '\0');
  std::memcpy(bytes.data(), &answer, 4);
  grpc::Slice slice(bytes);
  return Bytes(&slice, 1);
}

uint32_t AskedFor(const Bytes& request) {
  grpc::Slice bytes;
  if (!request.TrySingleSlice(&bytes).ok()) {
    (void)request.DumpToSingleSlice(&bytes);
  }
  uint32_t n = 0;
  if (bytes.size() >= 4) std::memcpy(&n, bytes.begin(), 4);
  return n;
}

Bytes Answer(uint32_t size) {
  grpc::Slice slice(std::string(size, '\1'));
  return Bytes(&slice, 1);
}

// Answers each message it reads, one at a time.
class EchoStream final : public grpc::ServerBidiReactor<Bytes, Bytes> {
 public:
  EchoStream() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    out_ = Answer(AskedFor(in_));
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  Bytes in_, out_;
};

// A unary method and a stream, both raw callback methods as `hetps
// server`'s tensor methods are (what generated code declares for them).
class EchoService final : public grpc::Service {
 public:
  EchoService() {
    using grpc::internal::RpcMethod;
    using grpc::internal::RpcServiceMethod;
    AddMethod(new RpcServiceMethod(kUnary, RpcMethod::NORMAL_RPC, nullptr));
    MarkMethodRawCallback(
        0, new grpc::internal::CallbackUnaryHandler<Bytes, Bytes>(
               [](grpc::CallbackServerContext* context, const Bytes* request,
                  Bytes* answer) {
                 *answer = Answer(AskedFor(*request));
                 grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
                 reactor->Finish(grpc::Status::OK);
                 return reactor;
               }));
    AddMethod(
        new RpcServiceMethod(kStream, RpcMethod::BIDI_STREAMING, nullptr));
    MarkMethodRawCallback(
        1, new grpc::internal::CallbackBidiHandler<Bytes, Bytes>(
               [](grpc::CallbackServerContext*) { return new EchoStream; }));
  }
};

// The child: serves until its parent goes; its port goes up `to_parent`.
[[noreturn]] void Serve(int to_parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  hetps::TuneProcess();
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxReceiveMessageSize(1 << 30);
  builder.SetMaxSendMessageSize(1 << 30);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr ||
      write(to_parent, &port, sizeof port) != sizeof port) {
    _exit(1);
  }
  server->Wait();
  _exit(0);
}

// The next event of `queue` came, and succeeded.
bool NextOk(grpc::CompletionQueue& queue) {
  void* tag;
  bool ok;
  return queue.Next(&tag, &ok) && ok;
}

// Shuts `queue` down and takes what is left in it (a queue may not be
// destroyed with events in it).
void Drain(grpc::CompletionQueue& queue) {
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
}

// One way of calling: Call() sends `request` and returns when the answer
// is in.
class Caller {
 public:
  virtual ~Caller() = default;
  virtual bool Call(const Bytes& request) = 0;
};

class UnaryCallback final : public Caller {
 public:
  explicit UnaryCallback(grpc::GenericStub& stub) : stub_(stub) {}
  bool Call(const Bytes& request) override {
    grpc::ClientContext context;
    Bytes answer;
    grpc::Status status;
    absl::Notification done;
    stub_.UnaryCall(&context, kUnary, grpc::StubOptions(), &request, &answer,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
    done.WaitForNotification();
    return status.ok();
  }

 private:
  grpc::GenericStub& stub_;
};

class UnaryQueue final : public Caller {
 public:
  explicit UnaryQueue(grpc::GenericStub& stub) : stub_(stub) {}
  bool Call(const Bytes& request) override {
    grpc::ClientContext context;
    Bytes answer;
    grpc::Status status;
    auto call = stub_.PrepareUnaryCall(&context, kUnary, request, &queue_);
    call->StartCall();
    call->Finish(&answer, &status, this);
    return NextOk(queue_) && status.ok();
  }
  ~UnaryQueue() override { Drain(queue_); }

 private:
  grpc::GenericStub& stub_;
  grpc::CompletionQueue queue_;
};

class StreamCallback final : public Caller,
                             public grpc::ClientBidiReactor<Bytes, Bytes> {
 public:
  explicit StreamCallback(grpc::GenericStub& stub) {
    stub.PrepareBidiStreamingCall(&context_, kStream, grpc::StubOptions(),
                                  this);
    StartCall();
  }
  bool Call(const Bytes& request) override {
    {
      absl::MutexLock lock(&mu_);
      left_ = 2;
      ok_ = true;
    }
    StartRead(&in_);
    StartWrite(&request);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* left) { return *left == 0; }, &left_));
    return ok_;
  }
  ~StreamCallback() override {
    StartWritesDone();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&over_));
  }
  void OnWriteDone(bool ok) override { Arrived(ok); }
  void OnReadDone(bool ok) override { Arrived(ok); }
  void OnDone(const grpc::Status&) override {
    absl::MutexLock lock(&mu_);
    over_ = true;
  }

 private:
  void Arrived(bool ok) {
    absl::MutexLock lock(&mu_);
    ok_ = ok_ && ok;
    --left_;
  }
  grpc::ClientContext context_;
  Bytes in_;
  absl::Mutex mu_;
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
};

class StreamQueue final : public Caller {
 public:
  explicit StreamQueue(grpc::GenericStub& stub)
      : stream_(stub.PrepareCall(&context_, kStream, &queue_)) {
    stream_->StartCall(this);
    NextOk(queue_);
  }
  bool Call(const Bytes& request) override {
    Bytes answer;
    stream_->Write(request, this);
    stream_->Read(&answer, this);
    // Both events come, in either order.
    const bool first = NextOk(queue_);
    return NextOk(queue_) && first;
  }
  ~StreamQueue() override {
    stream_->WritesDone(this);
    NextOk(queue_);
    grpc::Status status;
    stream_->Finish(&status, this);
    NextOk(queue_);
    Drain(queue_);
  }

 private:
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream_;
};

std::unique_ptr<Caller> MakeCaller(const std::string& mode,
                                   grpc::GenericStub& stub) {
  if (mode == "unary-callback") return std::make_unique<UnaryCallback>(stub);
  if (mode == "unary-cq") return std::make_unique<UnaryQueue>(stub);
  if (mode == "stream-callback") return std::make_unique<StreamCallback>(stub);
  if (mode == "stream-cq") return std::make_unique<StreamQueue>(stub);
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gRPC's own cost per call, by how the caller waits"};
  std::string modes_list = "unary-callback,unary-cq,stream-callback,stream-cq";
  std::string sizes_list = "100:8,8:100,720000:8";
  int reps = 2000;
  int rounds = 3;
  bool callback_threads = false;
  std::string out_path;
  app.add_option("--modes", modes_list, "comma-separated");
  app.add_option("--sizes", sizes_list,
                 "request:answer bytes, comma-separated");
  app.add_option("--reps", reps, "timed calls per mode, size and round");
  app.add_option("--rounds", rounds, "rounds of all modes");
  app.add_flag("--callback-threads", callback_threads,
               "start gRPC's callback threads in the client first");
  app.add_option("--out", out_path, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  const std::vector<std::string> modes = absl::StrSplit(modes_list, ',');
  std::vector<std::pair<uint32_t, uint32_t>> sizes;
  for (absl::string_view s : absl::StrSplit(sizes_list, ',')) {
    std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(s, ':');
    std::pair<uint32_t, uint32_t> size;
    if (!absl::SimpleAtoi(parts.first, &size.first) ||
        !absl::SimpleAtoi(parts.second, &size.second)) {
      std::fprintf(stderr, "--sizes: '%s' is not request:answer bytes\n",
                   std::string(s).c_str());
      return 2;
    }
    sizes.push_back(size);
  }
  if (reps < 1 || rounds < 1) {
    std::fprintf(stderr, "--reps and --rounds must be at least 1\n");
    return 2;
  }

  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  const pid_t server = fork();  // before gRPC starts in this process
  if (server == 0) {
    close(pipe_fds[0]);
    Serve(pipe_fds[1]);
  }
  close(pipe_fds[1]);
  int port = 0;
  if (server < 0 || read(pipe_fds[0], &port, sizeof port) != sizeof port) {
    std::fprintf(stderr, "the server did not start\n");
    return 1;
  }
  hetps::TuneProcess();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                grpc::InsecureChannelCredentials(), args));
  if (callback_threads && !UnaryCallback(stub).Call(Request(4, 0))) {
    std::fprintf(stderr, "the first call failed\n");
    return 1;
  }

  // times[mode][size][round]: {median, p90} in µs.
  std::vector<std::vector<std::vector<std::pair<double, double>>>> times(
      modes.size(),
      std::vector<std::vector<std::pair<double, double>>>(sizes.size()));
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const size_t m = (k + round) % modes.size();
      std::unique_ptr<Caller> caller = MakeCaller(modes[m], stub);
      if (caller == nullptr) {
        std::fprintf(stderr, "unknown mode '%s'\n", modes[m].c_str());
        return 2;
      }
      for (size_t s = 0; s < sizes.size(); ++s) {
        const Bytes request = Request(sizes[s].first, sizes[s].second);
        std::vector<double> us;
        for (int i = -reps / 10; i < reps; ++i) {  // a tenth to warm up
          const Clock::time_point start = Clock::now();
          if (!caller->Call(request)) {
            std::fprintf(stderr, "%s: a call failed\n", modes[m].c_str());
            return 1;
          }
          if (i >= 0) {
            us.push_back(
                std::chrono::duration<double, std::micro>(Clock::now() - start)
                    .count());
          }
        }
        times[m][s].emplace_back(hetps::Percentile(us, 0.5),
                                 hetps::Percentile(us, 0.9));
      }
    }
  }
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);

  nlohmann::json results = nlohmann::json::array();
  for (size_t m = 0; m < modes.size(); ++m) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<double> medians, p90s;
      for (const auto& [median, p90] : times[m][s]) {
        medians.push_back(median);
        p90s.push_back(p90);
      }
      results.push_back({{"mode", modes[m]},
                         {"request_bytes", sizes[s].first},
                         {"answer_bytes", sizes[s].second},
                         {"round_median_us", medians},
                         {"round_p90_us", p90s},
                         {"median_us", hetps::Median(medians)}});
    }
  }
  const nlohmann::json out = {{"benchmark", "grpc_floor"},
                              {"reps", reps},
                              {"rounds", rounds},
                              {"callback_threads", callback_threads},
                              {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << out.dump(2) << "\n";
  return 0;
}
