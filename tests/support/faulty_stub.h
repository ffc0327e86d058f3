// A ParameterServer stub that fails calls on purpose: the fault-injecting
// transport of the in-process client and coordinator tests. It passes calls
// to a real stub (a server of this process on loopback) except where a
// FaultPlan says otherwise:
//  - `refuse` calls of a method answer UNAVAILABLE without reaching the
//    server (a peer that is down, a dropped request);
//  - `lose_reply` calls reach the server and are applied, but the caller
//    sees UNAVAILABLE (the reply was lost: the caller retries what the
//    server already has);
//  - `dead` answers UNAVAILABLE to everything.
// It is a gmock stub (hetps_mock.grpc.pb.h) with the callback API added,
// which is what PsClient uses; the synchronous calls the coordinator and
// the BucketMover make go the same way.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "hetps.grpc.pb.h"
#include "hetps_mock.grpc.pb.h"

namespace hetps::testing {

class FaultPlan {
 public:
  // The next `n` calls of `method` ("Push", "PullSparse", ...).
  void Refuse(const std::string& method, int n);
  void LoseReply(const std::string& method, int n);
  void SetDead(bool dead);
  // Calls of `method` seen (faulted or not).
  int calls(const std::string& method) const;

  enum class Fault { kNone, kRefuse, kLoseReply };
  // Counts the call and says what happens to it.
  Fault Next(const std::string& method);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int> refuse_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> lose_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
};

// Stubs to real servers over gRPC (no credentials), faulted as `plan` says
// (one plan for every endpoint; `plan` must outlive the stubs).
ParameterServerStubs FaultyStubs(FaultPlan& plan);

}  // namespace hetps::testing
