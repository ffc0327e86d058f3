// ThreadSanitizer builds only (HETPS_TSAN): makes absl::Mutex visible to
// TSan. Debian's abseil is built without TSan, so its Mutex never tells TSan
// when it is taken or released, and TSan would report every access guarded
// by one as a race. This file defines the Mutex and CondVar entry points
// our code (and gRPC's) calls; each tells TSan what happens to the mutex and
// runs abseil's own function, found with dlsym(RTLD_NEXT). Linked into every
// executable of a TSan build; never into any other. The pass runs with
// TSAN_OPTIONS=ignore_noninstrumented_modules=1 (scripts/test.sh): gRPC's
// threads hand gRPC's own buffers to each other by means TSan cannot see
// either, and only accesses made by our (instrumented) code are judged.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace {

template <typename Fn>
Fn Next(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found\n", symbol);
    std::abort();  // a build problem, not anything a peer can cause
  }
  return reinterpret_cast<Fn>(fn);
}

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Time;

constexpr unsigned kRead = __tsan_mutex_read_lock;

// Inside one of the functions below: abseil calling its own entry points
// (WaitWithTimeout calls WaitWithDeadline, say) reaches them again, and
// only the outermost call may tell TSan.
thread_local int depth = 0;

class Outermost {
 public:
  Outermost() : outermost_(depth++ == 0) {}
  ~Outermost() { --depth; }
  bool operator()() const { return outermost_; }

 private:
  const bool outermost_;
};

// The mutex is released somewhere inside `wait` and held again after.
template <typename Wait>
auto Released(Mutex* mu, unsigned flags, Wait wait) {
  Outermost outermost;
  if (outermost()) {
    __tsan_mutex_pre_unlock(mu, flags);
    __tsan_mutex_post_unlock(mu, flags);
  }
  auto result = wait();
  if (outermost()) {
    __tsan_mutex_pre_lock(mu, flags);
    __tsan_mutex_post_lock(mu, flags, 0);
  }
  return result;
}

template <typename Lock>
auto Locked(Mutex* mu, unsigned flags, Lock lock) {
  Outermost outermost;
  if (outermost()) __tsan_mutex_pre_lock(mu, flags);
  auto result = lock();
  if (outermost()) __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

template <typename Unlock>
void Unlocked(Mutex* mu, unsigned flags, Unlock unlock) {
  Outermost outermost;
  if (outermost()) __tsan_mutex_pre_unlock(mu, flags);
  unlock();
  if (outermost()) __tsan_mutex_post_unlock(mu, flags);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

#define HETPS_NEXT(type, symbol) static const auto next = Next<type>(symbol)

void Mutex::Lock() {
  HETPS_NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  Locked(this, 0, [&] { return (next(this), 0); });
}

void Mutex::ReaderLock() {
  HETPS_NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  Locked(this, kRead, [&] { return (next(this), 0); });
}

void Mutex::Unlock() {
  HETPS_NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Unlocked(this, 0, [&] { next(this); });
}

void Mutex::ReaderUnlock() {
  HETPS_NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Unlocked(this, kRead, [&] { next(this); });
}

bool Mutex::TryLock() {
  HETPS_NEXT(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  Outermost outermost;
  if (outermost()) __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool got = next(this);
  if (outermost()) {
    __tsan_mutex_post_lock(
        this, __tsan_mutex_try_lock | (got ? 0 : __tsan_mutex_try_lock_failed),
        0);
  }
  return got;
}

void Mutex::LockWhen(const Condition& cond) {
  HETPS_NEXT(void (*)(Mutex*, const Condition&),
             "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Locked(this, 0, [&] { return (next(this, cond), 0); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  HETPS_NEXT(bool (*)(Mutex*, const Condition&, Duration),
             "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_"
             "8DurationE");
  return Locked(this, 0, [&] { return next(this, cond, timeout); });
}

void Mutex::Await(const Condition& cond) {
  HETPS_NEXT(void (*)(Mutex*, const Condition&),
             "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Released(this, 0, [&] { return (next(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  HETPS_NEXT(bool (*)(Mutex*, const Condition&, Duration),
             "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_"
             "8DurationE");
  return Released(this, 0, [&] { return next(this, cond, timeout); });
}

void CondVar::Wait(Mutex* mu) {
  HETPS_NEXT(void (*)(CondVar*, Mutex*),
             "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Released(mu, 0, [&] { return (next(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  HETPS_NEXT(bool (*)(CondVar*, Mutex*, Duration),
             "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_"
             "8DurationE");
  return Released(mu, 0, [&] { return next(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  HETPS_NEXT(
      bool (*)(CondVar*, Mutex*, Time),
      "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Released(mu, 0, [&] { return next(this, mu, deadline); });
}

#undef HETPS_NEXT

ABSL_NAMESPACE_END
}  // namespace absl
