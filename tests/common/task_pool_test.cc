#include "common/task_pool.h"

#include <atomic>
#include <latch>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "support/test_support.h"

namespace hetps {
namespace {

TEST(TaskPoolTest, RunsEveryTaskWithinItsBound) {
  TaskPool pool("test", 3);
  std::atomic<int> ran{0};
  absl::BlockingCounter done(100);
  for (int i = 0; i < 100; ++i) {
    pool.Run([&] {
      ++ran;
      done.DecrementCount();
    });
    EXPECT_LE(pool.threads(), 3u);
  }
  done.Wait();
  EXPECT_EQ(ran.load(), 100);
}

TEST(TaskPoolTest, AnUnboundedPoolRunsTasksThatWaitOnEachOther) {
  // Each task waits until all have started: a pool of fewer threads than
  // tasks would never get there (the test would hang and time out).
  constexpr int kTasks = 20;
  TaskPool pool("test", TaskPool::kUnbounded);
  std::latch all_started(kTasks);
  absl::BlockingCounter done(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    pool.Run([&] {
      all_started.arrive_and_wait();
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(pool.threads(), static_cast<size_t>(kTasks));
}

TEST(TaskPoolTest, IdleThreadsEndAndNewWorkStartsOneAgain) {
  TaskPool pool("test", 4, absl::Milliseconds(1));
  absl::Notification first;
  pool.Run([&] { first.Notify(); });
  first.WaitForNotification();
  ASSERT_TRUE(testing::WaitFor([&] { return pool.threads() == 0; }))
      << "the idle thread never ended";
  absl::Notification second;
  pool.Run([&] { second.Notify(); });
  second.WaitForNotification();
}

TEST(TaskPoolTest, TheDestructorRunsWhatIsQueuedIncludingTasksItQueues) {
  std::atomic<int> ran{0};
  {
    TaskPool pool("test", 1);
    absl::Notification release;
    pool.Run([&] { release.WaitForNotification(); });
    for (int i = 0; i < 10; ++i) {
      pool.Run([&] {
        ++ran;
        pool.Run([&] { ++ran; });
      });
    }
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace hetps
