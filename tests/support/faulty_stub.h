// A ParameterServer stub that fails calls on purpose: the fault-injecting
// transport of the in-process client and coordinator tests. It passes calls
// to a real stub (a server of this process on loopback) except where a
// FaultPlan says otherwise:
//  - `refuse` calls of a method answer UNAVAILABLE without reaching the
//    server (a peer that is down, a dropped request);
//  - `lose_reply` calls reach the server and are applied, but the caller
//    sees UNAVAILABLE (the reply was lost: the caller retries what the
//    server already has);
//  - `dead` answers UNAVAILABLE to everything;
//  - `refuse_when` holds the next call of a method until a notification,
//    then refuses it (a peer that went away while the caller did something
//    else: what the caller sends again is then decided after that);
//  - `on_call` runs a function as each call of a method is made, before
//    it reaches the server (to see the servers' state at that moment).
// It also keeps every PullSparse request it passed or faulted, in order.
// It is a gmock stub (hetps_mock.grpc.pb.h) with the callback API added,
// which is what PsClient uses besides its TensorCalls (faulted alike by
// FaultyPsClientStubs); the synchronous calls the coordinator and the
// BucketMover make go the same way.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "hetps.grpc.pb.h"
#include "support/mock_stubs.h"

namespace hetps::testing {

class FaultPlan {
 public:
  // The next `n` calls of `method` ("Push", "PullSparse", ...).
  void Refuse(const std::string& method, int n);
  void LoseReply(const std::string& method, int n);
  void SetDead(bool dead);
  // The next call of `method` waits (on its caller's thread) until `ready`
  // is notified, then answers UNAVAILABLE; `ready` must outlive that call.
  void RefuseWhen(const std::string& method, absl::Notification* ready);
  // `observe` runs on the caller's thread at every call of `method`.
  void OnCall(const std::string& method, std::function<void()> observe);
  // Calls of `method` seen (faulted or not).
  int calls(const std::string& method) const;
  std::vector<rpc::PullSparseRequest> pull_requests() const;
  void Saw(const rpc::PullSparseRequest& request);

  enum class Fault { kNone, kRefuse, kLoseReply };
  // Counts the call and says what happens to it.
  Fault Next(const std::string& method);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int> refuse_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> lose_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Notification*> refuse_when_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::function<void()>> on_call_ ABSL_GUARDED_BY(mu_);
  std::vector<rpc::PullSparseRequest> pulls_ ABSL_GUARDED_BY(mu_);
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
};

// Stubs to real servers over gRPC (no credentials), faulted as `plan` says
// (one plan for every endpoint; `plan` must outlive the stubs).
ParameterServerStubs FaultyStubs(FaultPlan& plan);
// The same for a PsClient: its Push and PullSparse (TensorCalls) are
// faulted as the stub's calls.
PsClientStubs FaultyPsClientStubs(FaultPlan& plan);

}  // namespace hetps::testing
