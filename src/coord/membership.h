// Membership: which workers are live, and the epoch that numbers each change
// of that set (DESIGN.md, "Coordinator"). Every worker of the job starts
// live. A worker leaves by saying so (Leave) or by staying silent: more than
// `heartbeat_timeout` since its last registration or heartbeat, or, if it
// never registered, more than `first_contact` since the start. Registering
// again brings a worker back (a restarted process: a new incarnation).
//
// A plain value: no locks, no threads; time comes in as arguments (the
// coordinator passes its Clock's Now()), so tests step through it by hand.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace hetps {

class Membership {
 public:
  Membership(uint32_t workers, absl::Time start,
             absl::Duration heartbeat_timeout, absl::Duration first_contact);

  struct Registration {
    uint32_t incarnation = 0;  // registrations of this rank so far
    bool rejoined = false;     // it had left the live set; the epoch moved
  };
  // `rank` < size().
  Registration Register(uint32_t rank, absl::Time now);
  void Heartbeat(uint32_t rank, absl::Time now);
  // Takes `rank` out of the live set; false when it was not in it.
  bool Leave(uint32_t rank, const std::string& reason);
  // Takes out every live worker silent for too long at `now`; returns them
  // with the reason, in rank order.
  std::vector<std::pair<uint32_t, std::string>> Expire(absl::Time now);

  uint32_t size() const { return static_cast<uint32_t>(workers_.size()); }
  uint64_t epoch() const { return epoch_; }
  bool live(uint32_t rank) const { return workers_[rank].live; }
  std::vector<uint32_t> Live() const;
  const std::string& left_reason(uint32_t rank) const {
    return workers_[rank].left_reason;
  }
  absl::Duration SilentFor(uint32_t rank, absl::Time now) const {
    return now - workers_[rank].last_seen;
  }

 private:
  struct Worker {
    bool live = true;
    bool registered = false;
    uint32_t incarnation = 0;
    absl::Time last_seen;
    std::string left_reason;
  };

  const absl::Duration heartbeat_timeout_;
  const absl::Duration first_contact_;
  uint64_t epoch_ = 1;
  std::vector<Worker> workers_;
};

}  // namespace hetps
