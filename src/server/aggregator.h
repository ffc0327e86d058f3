// Aggregator: decides when pushed gradients reach the tables — the seam where
// the consistency modes differ (DESIGN.md, "Consistency, precisely").
//
//  - sync: pushes of round c (each worker's c-th push) are merged — gradients
//    of one key summed, weighted by each push's batch size and divided by the
//    round's total batch — and applied once when every live worker has
//    contributed; a pull at clock c waits until rounds 0..c-1 are applied.
//    A round of fewer samples than a full round (the last merge of one push
//    from every worker of the job) takes that share of a step: the last
//    rounds of an epoch, when the workers that finished their data have
//    left.
//  - async: every push is applied on arrival; pulls wait only for their
//    own worker's pushes that were answered before their apply ended (see
//    Push's `accepted`).
//  - semi_async: pushes enter the GradientQueue, merged on arrival (each
//    weighted by batch size and by 1 / (1 + staleness_decay · staleness),
//    where staleness = applies the parameters it was computed on lacked).
//    The queue is applied — the weighted mean gradient, taking
//    Σ weight·batch / max(Σ batch, a full round's) of a full optimizer
//    step — when it holds `window` pushes, when every live worker has
//    contributed since the last apply and the queue holds
//    min_apply_fraction of a full round, or when its oldest push is
//    flush_after_s old. The SSP bound: a pull at clock c waits until
//    c - (smallest clock of a live worker) <= window. The window changes
//    when the coordinator says so (SetWindow).
//    Reads ahead (semi_async.lookahead): a live worker's pull while the
//    queue holds pushes gets the rows the queue's apply would leave if it
//    were applied now (its share of a step, as above), so a gradient is
//    computed on every gradient the server holds; the tables still take
//    one merged step per apply.
//
// Pushes are idempotent per (worker, clock): a retried push that already
// arrived is acknowledged and not applied again. In every mode a push from
// a worker outside the live set is refused (FAILED_PRECONDITION): the
// coordinator dropped it and gave its chunk to another worker; it registers
// again, as a new incarnation, to train on (WorkerSession).
//
// A worker's clock is known from its pushes and its pulls (a pull at clock c
// follows c pushes). A server restarted from a checkpoint starts with no
// clocks and no pending rounds while its workers are at round k: in sync
// mode the rounds every live worker has moved past and nobody pushed here
// (0..k-1) close empty, so the restarted server joins the job at round k.
//
// A pull that must wait (sync: its round; semi_async: the SSP bound) holds
// no thread while it does: AdmitPull keeps it with a callback, which the
// push (membership change, new window) that lets it go calls, or the
// aggregator's timer thread when its deadline passes or its caller cancels.
//
// Thread-safety: all methods may be called concurrently (gRPC's callback
// threads, several requests at once).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "hetps.pb.h"
#include "hetps/config.h"
#include "table/dense_table.h"
#include "table/sparse_table.h"

namespace hetps {

// A validated push: tables resolved, payloads viewed in place. The views are
// only read during Aggregator::Push.
struct PushView {
  struct Sparse {
    SparseTable* table;
    std::span<const uint64_t> keys;
    std::span<const float> grads;  // keys.size() * dim
  };
  struct Dense {
    DenseTable* table;
    std::span<const float> grads;  // table->length()
  };
  uint32_t worker_id = 0;
  uint64_t clock = 0;
  uint32_t batch_size = 1;
  std::vector<Sparse> sparse;
  std::vector<Dense> dense;
};

// What an Aggregator saw: rpc::AggregatorStats (proto/hetps.proto documents
// each field), filled in by the aggregator itself, so a new statistic is one
// field there and its counting here. Counters are totals since the start.
using AggregatorStats = rpc::AggregatorStats;

struct AggregatorOptions {
  // The samples of a full round (one push from every worker) until the
  // first one shows the real figure: train.batch_size × cluster.workers.
  // 0: merges take a full step until then.
  uint64_t job_batch = 0;
  // sync and semi_async: TrainConfig::warmup_rounds (0: none).
  uint32_t warmup_rounds = 0;
  // semi_async only: the initial window and the mode's settings.
  uint32_t window = 2;
  SemiAsyncConfig semi_async;
};

// A pull to admit (Aggregator::AdmitPull).
struct PullWait {
  uint32_t worker_id = 0;
  uint64_t clock = 0;   // pushes the worker has made
  // 1: the rows are for the worker's push after the next, asked for while
  // the step before computes (PullSparseRequest.ahead). sync and
  // semi_async admit it as a pull at clock + 1 once the worker's push at
  // `clock` has arrived — the rows a pull sent after that push would read;
  // async at once.
  uint32_t ahead = 0;
  absl::Time deadline;  // on the aggregator's clock
  // Polled while the pull waits: true ends the wait with CANCELLED. May be
  // empty.
  std::function<bool()> cancelled;
};

// Receives, once, the outcome of a pull that waited: OK (answer it now),
// DEADLINE_EXCEEDED or CANCELLED. It is called with no lock of the
// aggregator held, on the thread that let the pull go (a push's, a
// membership change's) or on the aggregator's timer thread, so it should
// hand real work (reading the rows) on to a thread of its own.
using PullAdmitted = std::function<void(absl::Status)>;

class Aggregator {
 public:
  // `num_workers`: the workers of the job, all live at the start.
  // Deadlines, waits and semi_async's time bound run on `clock`.
  static absl::StatusOr<std::unique_ptr<Aggregator>> Create(
      ConsistencyMode mode, uint32_t num_workers,
      AggregatorOptions options = {}, Clock& clock = Clock::Real());

  virtual ~Aggregator() = default;

  // FAILED_PRECONDITION when the push cannot belong to the current state
  // (sync: its round was already applied, or the worker left the live set).
  //
  // Where a push is applied on arrival (async), `accepted`, when set, is
  // called once the push is certain to be applied and before it is, on the
  // calling thread: its answer may go then, while the apply runs. Until the
  // apply ends, that worker's pulls wait (AdmitPull), so a worker reads
  // what it was told is in. The other modes do not call it: a push there is
  // queued or merged, and answered when Push returns.
  virtual absl::Status Push(const PushView& push,
                            const std::function<void()>& accepted) = 0;
  absl::Status Push(const PushView& push) { return Push(push, {}); }

  // Decides a pull of a worker that has made `wait.clock` pushes. When the
  // outcome is known now, returns it — OK (answer it), DEADLINE_EXCEEDED
  // (the deadline has passed) — and drops `admitted`. Otherwise keeps the
  // pull waiting without holding the caller, returns nullopt and calls
  // `admitted` once later: OK when it may be answered, DEADLINE_EXCEEDED
  // (naming the workers still missing) at `wait.deadline`, CANCELLED once
  // `wait.cancelled()` turns true (polled every few milliseconds).
  virtual std::optional<absl::Status> AdmitPull(PullWait wait,
                                                PullAdmitted admitted) = 0;

  // Reads rows (a dense slice) into `out` for a pull of `worker_id` that
  // AdmitPull admitted. semi_async may read them ahead of its queue (see
  // above); the other modes read the tables.
  virtual void PullSparse(uint32_t worker_id, SparseTable* table,
                          std::span<const uint64_t> keys,
                          std::span<float> out) {
    (void)worker_id;
    table->Pull(keys, out);
  }
  virtual void PullDense(uint32_t worker_id, DenseTable* table,
                         std::span<float> out) {
    (void)worker_id;
    table->Pull(out);
  }

  // Replaces the live set when `epoch` is newer than the last one seen.
  virtual void UpdateMembership(uint64_t epoch,
                                const std::vector<uint32_t>& live) = 0;

  // The tables were restored from a checkpoint: they hold trained values,
  // so no warm-up (AggregatorOptions::warmup_rounds) from here on.
  virtual void TablesRestored() {}

  // Sync: rounds applied. Async: pushes applied. semi_async: queue applies.
  virtual uint64_t applied_rounds() const = 0;

  // The clock a restarted `worker` (its own count back at 0) continues
  // from: sync: the open round; async: its next clock; semi_async: its
  // last clock, or the slowest live worker's when that is later.
  virtual uint64_t RejoinClock(uint32_t worker) const = 0;

  // Runs `fn(applied_rounds())` while no gradient is being applied, so the
  // tables it reads are between two updates (a checkpoint). Pushes and
  // pulls wait meanwhile.
  virtual void RunBetweenApplies(const std::function<void(uint64_t)>& fn) = 0;

  // Applies now what is held for a later apply (semi_async: the queue), so
  // that the tables hold every gradient received (a bucket handed to
  // another server takes them along). Sync's open rounds stay open; async
  // holds nothing.
  virtual void ApplyQueued() {}

  // semi_async: the new window (>= 1); other modes ignore it.
  virtual void SetWindow(uint32_t) {}
  // semi_async: the window now; other modes have none (0).
  virtual uint32_t window() const { return 0; }

  virtual AggregatorStats Stats() const = 0;
};

}  // namespace hetps
