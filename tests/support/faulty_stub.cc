#include "support/faulty_stub.h"

#include <utility>

#include "gmock/gmock.h"

namespace hetps::testing {

void FaultPlan::Refuse(const std::string& method, int n) {
  absl::MutexLock lock(&mu_);
  refuse_[method] += n;
}

void FaultPlan::LoseReply(const std::string& method, int n) {
  absl::MutexLock lock(&mu_);
  lose_[method] += n;
}

void FaultPlan::SetDead(bool dead) {
  absl::MutexLock lock(&mu_);
  dead_ = dead;
}

void FaultPlan::RefuseWhen(const std::string& method,
                           absl::Notification* ready) {
  absl::MutexLock lock(&mu_);
  refuse_when_[method] = ready;
}

void FaultPlan::OnCall(const std::string& method,
                       std::function<void()> observe) {
  absl::MutexLock lock(&mu_);
  on_call_[method] = std::move(observe);
}

std::vector<rpc::PullSparseRequest> FaultPlan::pull_requests() const {
  absl::MutexLock lock(&mu_);
  return pulls_;
}

void FaultPlan::Saw(const rpc::PullSparseRequest& request) {
  absl::MutexLock lock(&mu_);
  pulls_.push_back(request);
}

int FaultPlan::calls(const std::string& method) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

FaultPlan::Fault FaultPlan::Next(const std::string& method) {
  absl::Notification* ready = nullptr;
  std::function<void()> observe;
  {
    absl::MutexLock lock(&mu_);
    ++calls_[method];
    auto it = refuse_when_.find(method);
    if (it != refuse_when_.end()) {
      ready = it->second;
      refuse_when_.erase(it);
    }
    if (auto seen = on_call_.find(method); seen != on_call_.end()) {
      observe = seen->second;
    }
  }
  if (observe) observe();
  if (ready != nullptr) {
    ready->WaitForNotification();
    return Fault::kRefuse;
  }
  absl::MutexLock lock(&mu_);
  if (dead_) return Fault::kRefuse;
  if (refuse_[method] > 0) {
    --refuse_[method];
    return Fault::kRefuse;
  }
  if (lose_[method] > 0) {
    --lose_[method];
    return Fault::kLoseReply;
  }
  return Fault::kNone;
}

namespace {

const grpc::Status kUnavailable(grpc::StatusCode::UNAVAILABLE,
                                "injected fault: unavailable");

// Runs one call as the plan says: `call(done)` is the real call.
template <typename Call>
void Faulted(FaultPlan& plan, const std::string& method, Call call,
             std::function<void(grpc::Status)> done) {
  switch (plan.Next(method)) {
    case FaultPlan::Fault::kRefuse:
      done(kUnavailable);
      return;
    case FaultPlan::Fault::kLoseReply:
      call([done = std::move(done)](grpc::Status) { done(kUnavailable); });
      return;
    case FaultPlan::Fault::kNone:
      call(std::move(done));
      return;
  }
}

// Keeps the PullSparse requests; the rest pass unrecorded.
void Seen(FaultPlan& plan, const rpc::PullSparseRequest& request) {
  plan.Saw(request);
}
template <typename Request>
void Seen(FaultPlan&, const Request&) {}

class FaultyStub final
    : public ::testing::NiceMock<rpc::MockParameterServerStub> {
 public:
  FaultyStub(std::unique_ptr<rpc::ParameterServer::Stub> real, FaultPlan& plan)
      : real_(std::move(real)), plan_(plan), async_(*real_, plan_) {
    // The synchronous calls (the coordinator's) go through the same plan.
    ON_CALL(*this, GetTableInfo)
        .WillByDefault([this](grpc::ClientContext* ctx,
                              const rpc::TableInfoRequest& req,
                              rpc::TableInfoResponse* resp) {
          return Sync("GetTableInfo",
                      [&] { return real_->GetTableInfo(ctx, req, resp); });
        });
    ON_CALL(*this, UpdateMembership)
        .WillByDefault([this](grpc::ClientContext* ctx,
                              const rpc::MembershipUpdate& req,
                              rpc::MembershipAck* resp) {
          return Sync("UpdateMembership",
                      [&] { return real_->UpdateMembership(ctx, req, resp); });
        });
    // The BucketMover's calls.
    ON_CALL(*this, PrepareMove)
        .WillByDefault([this](grpc::ClientContext* ctx,
                              const rpc::PrepareMoveRequest& req,
                              rpc::PrepareMoveResponse* resp) {
          return Sync("PrepareMove",
                      [&] { return real_->PrepareMove(ctx, req, resp); });
        });
    ON_CALL(*this, AdoptShardMap)
        .WillByDefault([this](grpc::ClientContext* ctx,
                              const rpc::AdoptShardMapRequest& req,
                              rpc::AdoptShardMapResponse* resp) {
          return Sync("AdoptShardMap",
                      [&] { return real_->AdoptShardMap(ctx, req, resp); });
        });
    ON_CALL(*this, HandOver)
        .WillByDefault([this](grpc::ClientContext* ctx,
                              const rpc::HandOverRequest& req,
                              rpc::MovedRows* resp) {
          return Sync("HandOver",
                      [&] { return real_->HandOver(ctx, req, resp); });
        });
    ON_CALL(*this, TakeOver)
        .WillByDefault([this](grpc::ClientContext* ctx,
                              const rpc::TakeOverRequest& req,
                              rpc::TakeOverResponse* resp) {
          return Sync("TakeOver",
                      [&] { return real_->TakeOver(ctx, req, resp); });
        });
  }

  async_interface* async() override { return &async_; }

 private:
  template <typename Call>
  grpc::Status Sync(const std::string& method, Call call) {
    switch (plan_.Next(method)) {
      case FaultPlan::Fault::kRefuse:
        return kUnavailable;
      case FaultPlan::Fault::kLoseReply:
        call();
        return kUnavailable;
      case FaultPlan::Fault::kNone:
        break;
    }
    return call();
  }

  // The callback API, faulted.
  class Async final : public async_interface {
   public:
    Async(rpc::ParameterServer::Stub& real, FaultPlan& plan)
        : real_(real), plan_(plan) {}

#define HETPS_FAULTY_METHOD(Method, Request, Response)                     \
  void Method(grpc::ClientContext* ctx, const rpc::Request* req,           \
              rpc::Response* resp, std::function<void(grpc::Status)> done) \
      override {                                                           \
    Seen(plan_, *req);                                                     \
    Faulted(                                                               \
        plan_, #Method,                                                    \
        [&](std::function<void(grpc::Status)> d) {                         \
          real_.async()->Method(ctx, req, resp, std::move(d));             \
        },                                                                 \
        std::move(done));                                                  \
  }                                                                        \
  void Method(grpc::ClientContext* ctx, const rpc::Request* req,           \
              rpc::Response* resp, grpc::ClientUnaryReactor* reactor)      \
      override {                                                           \
    real_.async()->Method(ctx, req, resp, reactor);                        \
  }
    HETPS_FAULTY_METHOD(PullSparse, PullSparseRequest, PullSparseResponse)
    HETPS_FAULTY_METHOD(PullDense, PullDenseRequest, PullDenseResponse)
    HETPS_FAULTY_METHOD(Push, PushRequest, PushResponse)
    HETPS_FAULTY_METHOD(GetTableInfo, TableInfoRequest, TableInfoResponse)
    HETPS_FAULTY_METHOD(UpdateMembership, MembershipUpdate, MembershipAck)
    HETPS_FAULTY_METHOD(Save, SaveRequest, SaveResponse)
    HETPS_FAULTY_METHOD(PrepareMove, PrepareMoveRequest, PrepareMoveResponse)
    HETPS_FAULTY_METHOD(AdoptShardMap, AdoptShardMapRequest,
                        AdoptShardMapResponse)
    HETPS_FAULTY_METHOD(HandOver, HandOverRequest, MovedRows)
    HETPS_FAULTY_METHOD(TakeOver, TakeOverRequest, TakeOverResponse)
#undef HETPS_FAULTY_METHOD
    // Not faulted: PsClient's stream is its TensorCalls' (FaultyTensorCalls
    // fault the calls on it).
    void TensorStream(
        grpc::ClientContext* ctx,
        grpc::ClientBidiReactor<rpc::TensorFrame, rpc::TensorFrame>* reactor)
        override {
      real_.async()->TensorStream(ctx, reactor);
    }

   private:
    rpc::ParameterServer::Stub& real_;
    FaultPlan& plan_;
  };

  std::unique_ptr<rpc::ParameterServer::Stub> real_;
  FaultPlan& plan_;
  Async async_;
};

// Push and PullSparse as PsClient sends them, faulted the same way.
class FaultyTensorCalls final : public TensorCalls {
 public:
  FaultyTensorCalls(std::unique_ptr<TensorCalls> real, FaultPlan& plan)
      : real_(std::move(real)), plan_(plan) {}

  void Push(grpc::ClientContext* ctx, const PushCall* call,
            rpc::PushResponse* response, Done done) override {
    Faulted(
        plan_, "Push",
        [&](Done d) { real_->Push(ctx, call, response, std::move(d)); },
        std::move(done));
  }

  void PullSparse(grpc::ClientContext* ctx, const PullSparseCall* call,
                  PulledRows* answer, Done done) override {
    plan_.Saw(ToMessage(*call));
    Faulted(
        plan_, "PullSparse",
        [&](Done d) { real_->PullSparse(ctx, call, answer, std::move(d)); },
        std::move(done));
  }

 private:
  std::unique_ptr<TensorCalls> real_;
  FaultPlan& plan_;
};

}  // namespace

PsClientStubs FaultyPsClientStubs(FaultPlan& plan) {
  return [&plan](const std::string& endpoint) {
    auto channel = MakeChannel(endpoint, 64 << 20, Credentials());
    return PsClientStub{.stub = std::make_unique<FaultyStub>(
                            rpc::ParameterServer::NewStub(channel), plan),
                        .tensors = std::make_unique<FaultyTensorCalls>(
                            GrpcTensorCalls(channel), plan)};
  };
}

ParameterServerStubs FaultyStubs(FaultPlan& plan) {
  return [&plan](const std::string& endpoint)
             -> std::unique_ptr<rpc::ParameterServer::StubInterface> {
    return std::make_unique<FaultyStub>(
        rpc::ParameterServer::NewStub(
            MakeChannel(endpoint, 64 << 20, Credentials())),
        plan);
  };
}

}  // namespace hetps::testing
