// WorkerSession: one worker of a job, around a training loop it does not
// see into: registration and heartbeats, the servers, the data feed (chunks
// of the train split from the coordinator, batches sized by the plan),
// pushes encoded by the job's codec with its error feedback, the emulated
// device, progress for the planner, and the report. Trainer runs the
// built-in models through one; the Python module (python/) runs a user's
// model through another, so both get the same share of the data, the same
// plan and the same failure handling.
//
// A batch's life: NextBatch hands it out; pulls (PullSparse, PullDense,
// Waiting) are time the worker waits, not busy time; the rest until the
// push, or until the next NextBatch, is the batch's compute, paced to the
// emulated device's throughput; Push sends the gradient of the batches
// computed since the last push. NextBatch closes the batch before it:
// progress, throughput and loss go to the coordinator with the next
// heartbeat.
//
// Busy time is the time outside pulls (a pull is where sync and the SSP bound
// make a worker wait); busy_fraction = busy / training time.
//
// Dropped and back: a worker silent for longer than
// server.heartbeat_timeout_s (a paused process, a link that was down) is
// dropped by the coordinator, which hands its chunk to another worker, and
// the servers refuse its pushes. When it runs again it notices (a heartbeat
// reply, or a push refused while the coordinator says it is out), throws
// away the push in hand — its batches belong to the chunk handed on —,
// registers again as a new incarnation (the servers move its clock to where
// the job is) and trains on from a new chunk. Batches it trained since its
// last push and before noticing at a NextBatch go out with the next push
// (at most push_freq - 1 of them, which the chunk's new holder trains
// again); a push is never applied twice.
//
// Thread-safety: pulls may come from any thread; everything else from one
// training loop at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coord/coordinator_client.h"
#include "data/batch.h"
#include "data/reader.h"
#include "hetps/config.h"
#include "hetps/ps_client.h"
#include "model/job_shape.h"
#include "nlohmann/json.hpp"
#include "worker/device_profile.h"
#include "worker/push_codec.h"

namespace hetps {

struct EvalPoint {
  int epoch = 0;    // epochs finished when evaluated
  double at_s = 0;  // seconds since training started
  double auc = 0;
  double logloss = 0;
};

struct TrainReport {
  uint32_t rank = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  uint64_t positives = 0;     // samples labelled positive
  uint64_t feature_keys = 0;  // keys summed over samples
  double train_s = 0;         // training loop only
  double samples_per_s = 0;   // samples / train_s
  double last_loss = 0;       // mean loss of the last 50 batches
  uint64_t malformed_records = 0;
  uint64_t pushes = 0;
  uint64_t chunks = 0;            // chunks of the train split it trained on
  uint32_t rejoins = 0;           // registered again after being dropped
  uint64_t discarded_pushes = 0;  // of batches of a chunk handed on
  double busy_fraction = 0;       // time outside pulls / train_s
  bool emulated = false;          // ran under a DeviceProfile
  std::string device;             // DeviceProfile::Describe()
  uint64_t raw_bytes = 0;         // gradient payloads as fp32
  uint64_t sent_bytes = 0;        // as sent (compress.codec)
  uint64_t raw_value_bytes = 0;   // the same without keys and headers
  uint64_t sent_value_bytes = 0;
  PullStats pulls;  // sparse rows pulled and read from the hot-row cache
  std::vector<std::pair<std::string, uint64_t>> sent_by_codec;
  // (step, mean loss of the last 50 batches) every 20 steps.
  std::vector<std::pair<uint64_t, double>> loss_curve;
  std::vector<std::string> warnings;  // e.g. over-compression
  // Rank 0 only: the held-out evaluations, the last one of the final model.
  std::vector<EvalPoint> evals;
  std::optional<double> test_auc;
  std::optional<double> test_logloss;
  // `hetps calibrate` (worker/calibration.h): what the worker measured.
  nlohmann::json calibration;
};

// One-line JSON of a report (the launcher gathers these).
std::string ReportToJson(const TrainReport& report);

// The line prefix that marks a report in a worker's stdout.
inline constexpr const char* kReportPrefix = "HETPS_REPORT ";

class WorkerSession {
 public:
  // Opens this worker's view of the train split, registers, connects to the
  // servers, takes the first plan, starts heartbeats and waits at the
  // "start" barrier until every worker is there. `config` validated and
  // resolved into `shape` (ResolveJob), with cluster.ps_endpoints filled in;
  // both must outlive the session.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Start(
      const JobConfig& config, const JobShape& shape, uint32_t rank,
      Clock& clock = Clock::Real());
  ~WorkerSession();

  // Fills `batch` with this worker's next batch: up to the plan's batch size
  // from the chunk in hand, taking the next chunk from the coordinator when
  // that one is done. Returns the samples; 0 when no chunk is left.
  // RESOURCE_EXHAUSTED when the batch would not fit the emulated memory.
  absl::StatusOr<size_t> NextBatch(Batch* batch);

  // Reads the batch after the one in hand, when the chunk in hand has one,
  // so that its parameters can be pulled while this one computes
  // (train.prefetch); nullptr when the chunk has none (the next NextBatch
  // takes a new chunk). The next NextBatch hands that batch out (swapped
  // into its `batch`) and read_ahead_taken() says so — unless the worker
  // was dropped meanwhile: the batch goes with its chunk then. The batch
  // stays valid until the next NextBatch.
  absl::StatusOr<const Batch*> ReadAhead();
  // Whether the last NextBatch handed out the batch ReadAhead read.
  bool read_ahead_taken() const { return read_ahead_taken_; }

  // The loss summed over the batch in hand (for the report, the loss curve
  // and the over-compression check); optional.
  void SetLoss(double loss_sum);

  // Pulls as this worker, throttled to the emulated link.
  absl::Status PullSparse(const std::string& table,
                          std::span<const uint64_t> keys, std::span<float> out,
                          KeySet key_set = KeySet::kMayRepeat);
  absl::Status PullDense(const std::string& table, std::span<float> out);
  // Runs `f` (a pull of the caller's own, an evaluation) as time this worker
  // waits: neither busy nor part of the batch's compute.
  absl::Status Waiting(absl::FunctionRef<absl::Status()> f);

  // Pushes the gradients of the batches computed since the last push, on
  // `samples` samples, encoded as compress.codec chooses; paces the compute
  // behind it first.
  absl::Status Push(std::span<const TableGrad> grads, uint32_t samples,
                    KeySet key_set = KeySet::kMayRepeat);

  // Closes the batch in hand, leaves the live set (nobody waits for this
  // worker any more) and waits until every worker has left: the model is
  // final. Gradients not pushed yet are the caller's to push before.
  absl::Status Finish();
  // Leaves the live set without waiting for anybody (a training loop that
  // failed); the coordinator hands the chunk in hand to another worker.
  absl::Status Abandon(const std::string& reason);

  // The report so far (complete after Finish).
  TrainReport Report() const;
  // The evaluations and the final model's numbers (rank 0), for the report.
  void AddEval(const EvalPoint& point);
  void SetFinalEval(double auc, double logloss);
  // Where evaluations made on another thread show up while training (rank
  // 0's PeriodicEvaluator): the latest one goes into the heartbeat.
  void SetEvalSource(std::function<std::optional<EvalPoint>()> latest) {
    eval_source_ = std::move(latest);
  }
  // Malformed records met outside the train split (the test split).
  void AddMalformed(uint64_t records);

  // Fixes this worker's batch size and push_freq (0: follow the plan, the
  // default); the planner's later plans no longer change them.
  void FixPlan(uint32_t batch_size, uint32_t push_freq);

  uint32_t rank() const { return rank_; }
  // Samples trained and time spent computing (not waiting) so far.
  uint64_t samples() const { return report_.samples; }
  double busy_seconds() const { return busy_s_; }
  // Epochs finished before the chunk in hand.
  int epoch() const { return epoch_; }
  uint32_t batch_size() const { return batch_size_; }
  uint32_t push_freq() const { return push_freq_; }
  const JobConfig& config() const { return config_; }
  const JobShape& shape() const { return shape_; }
  const DeviceProfile& device() const { return *device_; }
  PsClient& client() { return *client_; }
  // When training started (after the start barrier), on the session's
  // clock, and the seconds since.
  absl::Time start() const { return start_; }
  double SecondsSinceStart() const;

 private:
  WorkerSession(const JobConfig& config, const JobShape& shape, uint32_t rank,
                Clock& clock);
  absl::Status Open();
  // After the coordinator dropped this worker: registers again, drops the
  // chunk in hand, and tells the client the new incarnation.
  absl::Status Rejoin();
  absl::Status Seek(const rpc::ChunkResponse& chunk);
  void FollowPlan();
  // Sleeps off the emulated device's compute time of the batches handed
  // out and not paced yet.
  void PaceCompute();
  void CloseBatch();
  double MeanRecentLoss() const;
  // The standard error of MeanRecentLoss (batch losses taken as
  // independent).
  double RecentLossError() const;
  rpc::WorkerProgress Progress() const;

  const JobConfig& config_;
  const JobShape& shape_;
  const uint32_t rank_;
  Clock& clock_;
  const uint32_t chunks_;
  CoordinatorClient coordinator_;
  std::unique_ptr<Reader> train_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<PushCodec> codec_;
  std::unique_ptr<DeviceProfile> device_;
  absl::Time start_;
  absl::Time last_log_;

  std::function<std::optional<EvalPoint>()> eval_source_;
  TrainReport report_;
  bool have_chunk_ = false;
  bool finished_ = false;
  uint64_t chunk_samples_ = 0;  // read from the chunk in hand (handed out or ahead)
  int epoch_ = 0;
  uint64_t plan_version_ = 0;
  uint32_t batch_size_;
  uint32_t push_freq_ = 1;
  uint32_t fixed_batch_size_ = 0, fixed_push_freq_ = 0;  // FixPlan

  // The batch in hand: when it was asked for, its samples, its loss.
  absl::Time batch_began_;
  uint64_t batch_samples_ = 0;
  // The batch after it, when ReadAhead read one (ahead_samples_ > 0).
  Batch ahead_;
  uint64_t ahead_samples_ = 0;
  bool read_ahead_taken_ = false;
  std::optional<double> batch_loss_;
  // Samples handed out whose compute is not paced yet.
  uint64_t unpaced_samples_ = 0;
  double compute_since_push_s_ = 0;  // paced compute behind the next push
  double train_s_ = 0;               // set by Finish
  // Compute and waiting. Pulls may come from any thread: while at least one
  // runs (`waiting_`) the clock counts waiting; otherwise compute, in
  // segments from `segment_began_`, summed into `computed_s_` until paced.
  mutable absl::Mutex wait_mu_;
  int waiting_ ABSL_GUARDED_BY(wait_mu_) = 0;
  absl::Time segment_began_ ABSL_GUARDED_BY(wait_mu_);
  absl::Time wait_began_ ABSL_GUARDED_BY(wait_mu_);
  double computed_s_ ABSL_GUARDED_BY(wait_mu_) = 0;
  double batch_wait_s_ ABSL_GUARDED_BY(wait_mu_) = 0;

  double busy_s_ = 0;  // time outside pulls
  double recent_samples_ = 0, recent_busy_s_ = 0;
  std::deque<double> recent_loss_;
};

// A PsClient for the job's servers as worker `worker_id` (or kReaderId).
absl::StatusOr<std::unique_ptr<PsClient>> ConnectClient(const JobConfig& config,
                                                        uint32_t worker_id,
                                                        uint32_t incarnation);

}  // namespace hetps
