#include "coord/membership.h"

#include "absl/strings/str_cat.h"

namespace hetps {

Membership::Membership(uint32_t workers, absl::Time start,
                       absl::Duration heartbeat_timeout,
                       absl::Duration first_contact)
    : heartbeat_timeout_(heartbeat_timeout),
      first_contact_(first_contact),
      workers_(workers) {
  for (Worker& w : workers_) w.last_seen = start;
}

Membership::Registration Membership::Register(uint32_t rank, absl::Time now) {
  Worker& w = workers_[rank];
  w.registered = true;
  w.last_seen = now;
  Registration r;
  r.incarnation = ++w.incarnation;
  if (!w.live) {
    w.live = true;
    w.left_reason.clear();
    ++epoch_;
    r.rejoined = true;
  }
  return r;
}

void Membership::Heartbeat(uint32_t rank, absl::Time now) {
  workers_[rank].last_seen = now;
}

bool Membership::Leave(uint32_t rank, const std::string& reason) {
  Worker& w = workers_[rank];
  if (!w.live) return false;
  w.live = false;
  w.left_reason = reason;
  ++epoch_;
  return true;
}

std::vector<std::pair<uint32_t, std::string>> Membership::Expire(
    absl::Time now) {
  std::vector<std::pair<uint32_t, std::string>> gone;
  for (uint32_t r = 0; r < workers_.size(); ++r) {
    const Worker& w = workers_[r];
    if (!w.live) continue;
    const absl::Duration silent = now - w.last_seen;
    std::string reason;
    if (w.registered && silent > heartbeat_timeout_) {
      reason = absl::StrCat("no heartbeat for ", absl::FormatDuration(silent));
    } else if (!w.registered && silent > first_contact_) {
      reason = absl::StrCat("never registered within ",
                            absl::FormatDuration(first_contact_));
    } else {
      continue;
    }
    Leave(r, reason);
    gone.emplace_back(r, std::move(reason));
  }
  return gone;
}

std::vector<uint32_t> Membership::Live() const {
  std::vector<uint32_t> live;
  for (uint32_t r = 0; r < workers_.size(); ++r) {
    if (workers_[r].live) live.push_back(r);
  }
  return live;
}

}  // namespace hetps
