// The `hetps._hetps` extension: a WorkerSession (worker/session.h) for a
// training loop written in Python, numpy in and out. python/hetps/ wraps it
// into the public module (docs/PYTHON.md).
//
//  - Every call that may touch the network, the disk or a barrier releases
//    the GIL, so the caller's other threads (data loading, a progress bar)
//    run meanwhile.
//  - Arrays: keys are uint64 (int64 is taken as the same bits, so torch's
//    LongTensor ids pass without a copy), values float32, C-contiguous;
//    anything else is a TypeError naming the argument. Pulls write straight
//    into the numpy array they return (or into `out`); a Batch's arrays
//    are views of its C++ buffers.
//  - A non-OK status raises the hetps.errors class of its code with the
//    server's message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/unique_keys.h"
#include "common/logging.h"
#include "common/process_tuning.h"
#include "config/credentials.h"
#include "config/environment.h"
#include "coord/coordinator_client.h"
#include "data/batch.h"
#include "data/reader.h"
#include "hetps/config.h"
#include "hetps/version.h"
#include "model/job_shape.h"
#include "model/metrics.h"
#include "worker/session.h"
#include "convert.h"

namespace py = pybind11;

namespace hetps {
namespace {

using python::Check;
using python::ConstSpan;
using python::Contiguous;
using python::Output;
using python::Raise;
using python::Value;
using python::View;

// ---------------------------------------------------------------------------
// A batch of the data feed: views of its C++ buffers (data/batch.h).

struct PyBatch {
  Batch batch;
  int epoch = 0;
};

// ---------------------------------------------------------------------------
// Configs

// getenv over a Python mapping (the environment the caller hands in).
std::function<const char*(const char*)> GetenvOf(
    const std::map<std::string, std::string>& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// ---------------------------------------------------------------------------
// The worker

class PyWorker {
 public:
  // The job as the CLI builds it: `config_path` (may be empty) with
  // `overrides`, then the Paddle-style variables of `env`; rank -1 takes
  // PADDLE_TRAINER_ID. Connects and waits at the start barrier.
  PyWorker(const std::string& config_path, int rank,
           const std::vector<std::string>& overrides,
           const std::map<std::string, std::string>& env) {
    config_ = Value(BuildJobConfig(config_path, overrides));
    RoleAssignment role = Value(ApplyPaddleEnvironment(config_, GetenvOf(env)));
    if (rank < 0) rank = role.rank;
    Check(ValidateJobConfig(config_));
    shape_ = Value(ResolveJob(config_));
    Check(ResolveCredentials(config_, std::getenv));
    if (rank < 0 || rank >= config_.num_workers()) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("rank: ", rank, " is not in [0, ",
                       config_.num_workers(), ") (cluster.workers)")));
    }
    if (config_.cluster.ps_endpoints.empty()) {
      if (config_.cluster.rendezvous.empty()) {
        Raise(absl::InvalidArgumentError(
            "cluster.ps_endpoints: a worker needs the server endpoints "
            "(config, overrides, or PADDLE_PSERVERS_IP_PORT_LIST) or "
            "cluster.rendezvous, server 0's host:port"));
      }
      absl::StatusOr<std::vector<std::string>> servers;
      {
        py::gil_scoped_release release;
        servers = ServersAtRendezvous(config_);
      }
      config_.cluster.ps_endpoints = Value(std::move(servers));
    }
    static absl::once_flag logging;
    absl::call_once(logging, [&] {
      SetupLogging(config_.log_level, absl::StrCat("worker ", rank));
    });
    absl::StatusOr<std::unique_ptr<WorkerSession>> session;
    {
      py::gil_scoped_release release;
      session = WorkerSession::Start(config_, shape_,
                                     static_cast<uint32_t>(rank));
    }
    session_ = Value(std::move(session));
  }

  ~PyWorker() {
    py::gil_scoped_release release;
    session_.reset();
  }

  void FixPlan(uint32_t batch_size, uint32_t push_freq) {
    absl::MutexLock lock(&loop_mu_);
    session_->FixPlan(batch_size, push_freq);
  }

  uint32_t rank() const { return session_->rank(); }
  int epoch() const { return session_->epoch(); }
  uint32_t batch_size() const { return session_->batch_size(); }
  uint32_t push_freq() const { return session_->push_freq(); }
  int num_slots() const { return shape_.data.num_slots; }
  int num_dense() const { return shape_.data.num_dense; }
  int num_workers() const { return config_.num_workers(); }
  std::string mode() const { return ConsistencyModeName(config_.mode); }
  std::vector<std::string> endpoints() const {
    return config_.cluster.ps_endpoints;
  }

  // The train section's settings a training loop follows.
  py::dict train_config() const {
    py::dict d;
    d["epochs"] = config_.train.epochs;
    d["batch_size"] = config_.train.batch_size;
    d["eval_every_epochs"] = config_.train.eval_every_epochs;
    d["eval_every_s"] = config_.train.eval_every_s;
    d["data_format"] = config_.train.data.format;
    return d;
  }

  std::vector<py::dict> tables() const {
    std::vector<py::dict> out;
    for (const TableConfig& t : config_.tables) {
      py::dict d;
      d["name"] = t.name;
      d["kind"] = t.kind == TableKind::kSparse ? "sparse" : "dense";
      d["dim"] = t.dim;
      d["optimizer"] = t.optimizer.type;
      d["learning_rate"] = t.optimizer.learning_rate;
      out.push_back(d);
    }
    return out;
  }

  uint64_t TableDim(const std::string& table) {
    absl::StatusOr<uint64_t> dim;
    {
      py::gil_scoped_release release;
      dim = session_->client().TableDim(table);
    }
    return Value(std::move(dim));
  }

  py::array_t<float> PullSparse(const std::string& table, py::handle keys_in,
                                std::optional<py::array> out,
                                bool unique_keys) {
    const py::array keys = Contiguous<uint64_t>(keys_in, "keys");
    const uint64_t dim = TableDim(table);
    py::array_t<float> rows =
        Output(out, {static_cast<py::ssize_t>(keys.size()),
                     static_cast<py::ssize_t>(dim)});
    std::span<float> dst(rows.mutable_data(), static_cast<size_t>(rows.size()));
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = session_->PullSparse(
          table, ConstSpan<uint64_t>(keys), dst,
          unique_keys ? KeySet::kUnique : KeySet::kMayRepeat);
    }
    Check(s);
    return rows;
  }

  // The distinct keys of `keys_in` (first-seen order), their rows, and for
  // every key its row's index (int64, for torch indexing).
  py::tuple PullUnique(const std::string& table, py::handle keys_in) {
    const py::array keys = Contiguous<uint64_t>(keys_in, "keys");
    const uint64_t dim = TableDim(table);
    UniqueKeys unique;
    {
      py::gil_scoped_release release;
      unique.Build(ConstSpan<uint64_t>(keys));
    }
    const auto n = static_cast<py::ssize_t>(unique.keys().size());
    py::array_t<uint64_t> distinct(n);
    py::array_t<float> rows({n, static_cast<py::ssize_t>(dim)});
    py::array_t<int64_t> inverse(keys.size());
    absl::Status s;
    {
      py::gil_scoped_release release;
      std::copy(unique.keys().begin(), unique.keys().end(),
                distinct.mutable_data());
      std::copy(unique.position().begin(), unique.position().end(),
                inverse.mutable_data());
      s = session_->PullSparse(
          table, unique.keys(),
          std::span<float>(rows.mutable_data(), static_cast<size_t>(rows.size())),
          KeySet::kUnique);
    }
    Check(s);
    return py::make_tuple(distinct, rows, inverse);
  }

  py::array_t<float> PullDense(const std::string& table,
                               std::optional<py::array> out) {
    const uint64_t size = TableDim(table);
    py::array_t<float> values = Output(out, {static_cast<py::ssize_t>(size)});
    std::span<float> dst(values.mutable_data(),
                         static_cast<size_t>(values.size()));
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = session_->PullDense(table, dst);
    }
    Check(s);
    return values;
  }

  // grads: {table: values (dense) or (keys, values) (sparse)}.
  void Push(const py::dict& grads, uint32_t batch_size, bool unique_keys) {
    std::vector<py::array> hold;  // keeps every array alive without the GIL
    std::vector<std::string> names;
    std::vector<std::pair<size_t, size_t>> arrays;  // (keys or -1, values)
    constexpr size_t kNone = static_cast<size_t>(-1);
    for (const auto& [name, value] : grads) {
      names.push_back(py::cast<std::string>(name));
      const std::string what = absl::StrCat("grads['", names.back(), "']");
      if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
        const py::sequence pair = py::reinterpret_borrow<py::sequence>(value);
        if (pair.size() != 2) {
          throw py::value_error(what + ": expected (keys, values)");
        }
        hold.push_back(Contiguous<uint64_t>(pair[0], (what + " keys").c_str()));
        hold.push_back(Contiguous<float>(pair[1], (what + " values").c_str()));
        arrays.emplace_back(hold.size() - 2, hold.size() - 1);
      } else {
        hold.push_back(Contiguous<float>(value, what.c_str()));
        arrays.emplace_back(kNone, hold.size() - 1);
      }
    }
    std::vector<TableGrad> table_grads;
    for (size_t i = 0; i < names.size(); ++i) {
      TableGrad g;
      g.table = names[i];
      if (arrays[i].first != kNone) {
        g.keys = ConstSpan<uint64_t>(hold[arrays[i].first]);
      }
      g.values = ConstSpan<float>(hold[arrays[i].second]);
      table_grads.push_back(g);
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&loop_mu_);
      s = session_->Push(table_grads, batch_size,
                         unique_keys ? KeySet::kUnique : KeySet::kMayRepeat);
    }
    Check(s);
  }

  // The next batch of this worker's data, or None when there is none left.
  std::optional<PyBatch> NextBatch() {
    auto batch = std::make_optional<PyBatch>();
    absl::StatusOr<size_t> n;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&loop_mu_);
      n = session_->NextBatch(&batch->batch);
      batch->epoch = session_->epoch();
    }
    if (Value(std::move(n)) == 0) return std::nullopt;
    return batch;
  }

  // The test split from its start (rank-independent: every worker sees the
  // whole held-out set).
  void RewindTest() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      if (!test_) {
        auto reader = OpenReader(config_.train.data, Split::kTest, 0, 1);
        if (!reader.ok()) {
          s = reader.status();
        } else {
          test_ = std::move(*reader);
        }
      }
      if (s.ok()) s = test_->Rewind();
    }
    Check(s);
  }

  std::optional<PyBatch> NextTestBatch(size_t max_samples) {
    if (!test_) RewindTest();
    auto batch = std::make_optional<PyBatch>();
    absl::StatusOr<size_t> n;
    {
      py::gil_scoped_release release;
      n = test_->Next(max_samples, &batch->batch);
    }
    if (Value(std::move(n)) == 0) return std::nullopt;
    batch->epoch = session_->epoch();
    return batch;
  }

  void RecordLoss(double mean_loss, uint64_t samples) {
    absl::MutexLock lock(&loop_mu_);
    session_->SetLoss(mean_loss * static_cast<double>(samples));
  }

  void RecordEval(double auc, double logloss, int epoch) {
    absl::MutexLock lock(&loop_mu_);
    session_->AddEval(EvalNow(auc, logloss, epoch));
  }

  // Leaves and waits for every worker: the model is final.
  void Finish() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&loop_mu_);
      s = session_->Finish();
    }
    Check(s);
  }

  // The final model's held-out numbers (rank 0), for the report.
  void RecordFinalEval(double auc, double logloss) {
    absl::MutexLock lock(&loop_mu_);
    session_->AddEval(EvalNow(auc, logloss, config_.train.epochs));
    session_->SetFinalEval(auc, logloss);
  }

  void Abandon(const std::string& reason) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&loop_mu_);
      s = session_->Abandon(reason);
    }
    Check(s);
  }

  std::string Report() {
    absl::MutexLock lock(&loop_mu_);
    TrainReport report = session_->Report();
    if (test_) report.malformed_records += test_->stats().malformed;
    return ReportToJson(report);
  }

  // `hetps status --json` of the job, as a JSON string.
  std::string Status(double timeout_s) {
    absl::StatusOr<rpc::StatusResponse> status;
    {
      py::gil_scoped_release release;
      status = QueryStatus(config_.cluster.ps_endpoints[0], timeout_s,
                           config_.credentials);
    }
    return StatusToJson(Value(std::move(status))).dump();
  }

 private:
  EvalPoint EvalNow(double auc, double logloss, int epoch) const {
    return {.epoch = epoch,
            .at_s = session_->SecondsSinceStart(),
            .auc = auc,
            .logloss = logloss};
  }

  JobConfig config_;
  JobShape shape_;
  std::unique_ptr<WorkerSession> session_;
  std::unique_ptr<Reader> test_;
  // NextBatch, Push, Finish and the report: one training loop at a time.
  // Pulls do not take it (PsClient and the session's wait accounting are
  // thread-safe).
  absl::Mutex loop_mu_;
};

// ---------------------------------------------------------------------------

double Metric(py::handle scores_in, py::handle labels_in, bool auc) {
  const py::array scores = Contiguous<float>(scores_in, "scores");
  const py::array labels = Contiguous<float>(labels_in, "labels");
  if (scores.size() != labels.size() || scores.size() == 0) {
    throw py::value_error(absl::StrCat("scores and labels: expected the same ",
                                       "non-zero length, got ", scores.size(),
                                       " and ", labels.size()));
  }
  return auc ? Auc(ConstSpan<float>(scores), ConstSpan<float>(labels))
             : LogLoss(ConstSpan<float>(scores), ConstSpan<float>(labels));
}

}  // namespace
}  // namespace hetps

PYBIND11_MODULE(_hetps, m) {
  using hetps::PyBatch;
  using hetps::PyWorker;
  m.doc() = "hetps worker API (the C++ core; use the hetps package)";
  // As every hetps process does (common/process_tuning.h); docs/PYTHON.md
  // says so, and HETPS_KEEP_MALLOC=1 leaves the interpreter's malloc alone.
  if (const char* keep = std::getenv("HETPS_KEEP_MALLOC");
      keep == nullptr || std::string(keep) != "1") {
    hetps::TuneProcess();
  }
  m.attr("__version__") = hetps::kVersionString;
  m.attr("_REPORT_PREFIX") = hetps::kReportPrefix;

  py::class_<PyBatch>(m, "Batch", "A batch of a worker's share of the data.")
      .def_property_readonly(
          "size", [](const PyBatch& b) { return b.batch.size(); })
      .def("__len__", [](const PyBatch& b) { return b.batch.size(); })
      .def_property_readonly("num_slots",
                             [](const PyBatch& b) { return b.batch.num_slots; })
      .def_property_readonly("num_dense",
                             [](const PyBatch& b) { return b.batch.num_dense; })
      .def_readonly("epoch", &PyBatch::epoch)
      .def_property_readonly("labels",
                             [](py::object self) {
                               const auto& b = self.cast<const PyBatch&>().batch;
                               return hetps::View(
                                   b.labels,
                                   {static_cast<py::ssize_t>(b.size())}, self);
                             })
      .def_property_readonly(
          "dense",
          [](py::object self) {
            const auto& b = self.cast<const PyBatch&>().batch;
            return hetps::View(b.dense,
                               {static_cast<py::ssize_t>(b.size()),
                                static_cast<py::ssize_t>(b.num_dense)},
                               self);
          })
      .def_property_readonly(
          "keys",
          [](py::object self) {
            const auto& b = self.cast<const PyBatch&>().batch;
            return hetps::View(b.keys, {static_cast<py::ssize_t>(b.keys.size())},
                               self);
          })
      .def_property_readonly("offsets", [](py::object self) {
        const auto& b = self.cast<const PyBatch&>().batch;
        return hetps::View(b.offsets,
                           {static_cast<py::ssize_t>(b.offsets.size())}, self);
      });

  py::class_<PyWorker>(m, "_Worker")
      .def(py::init<const std::string&, int, const std::vector<std::string>&,
                    const std::map<std::string, std::string>&>(),
           py::arg("config") = "", py::arg("rank") = -1,
           py::arg("overrides") = std::vector<std::string>{},
           py::arg("environ") = std::map<std::string, std::string>{})
      .def("fix_plan", &PyWorker::FixPlan, py::arg("batch_size"),
           py::arg("push_freq"))
      .def_property_readonly("rank", &PyWorker::rank)
      .def_property_readonly("epoch", &PyWorker::epoch)
      .def_property_readonly("batch_size", &PyWorker::batch_size)
      .def_property_readonly("push_freq", &PyWorker::push_freq)
      .def_property_readonly("num_slots", &PyWorker::num_slots)
      .def_property_readonly("num_dense", &PyWorker::num_dense)
      .def_property_readonly("num_workers", &PyWorker::num_workers)
      .def_property_readonly("mode", &PyWorker::mode)
      .def_property_readonly("endpoints", &PyWorker::endpoints)
      .def_property_readonly("tables", &PyWorker::tables)
      .def_property_readonly("train_config", &PyWorker::train_config)
      .def("table_dim", &PyWorker::TableDim, py::arg("table"))
      .def("pull_sparse", &PyWorker::PullSparse, py::arg("table"),
           py::arg("keys"), py::arg("out") = py::none(),
           py::arg("unique_keys") = false)
      .def("pull_unique", &PyWorker::PullUnique, py::arg("table"),
           py::arg("keys"))
      .def("pull_dense", &PyWorker::PullDense, py::arg("table"),
           py::arg("out") = py::none())
      .def("push", &PyWorker::Push, py::arg("grads"), py::arg("batch_size"),
           py::arg("unique_keys") = false)
      .def("next_batch", &PyWorker::NextBatch)
      .def("rewind_test", &PyWorker::RewindTest)
      .def("next_test_batch", &PyWorker::NextTestBatch,
           py::arg("max_samples") = 4096)
      .def("record_loss", &PyWorker::RecordLoss, py::arg("mean_loss"),
           py::arg("samples"))
      .def("record_eval", &PyWorker::RecordEval, py::arg("auc"),
           py::arg("logloss"), py::arg("epoch"))
      .def("_finish", &PyWorker::Finish)
      .def("_record_final_eval", &PyWorker::RecordFinalEval, py::arg("auc"),
           py::arg("logloss"))
      .def("_abandon", &PyWorker::Abandon, py::arg("reason"))
      .def("_report", &PyWorker::Report)
      .def("_status", &PyWorker::Status, py::arg("timeout_s") = 10.0);

  m.def(
      "auc",
      [](py::handle scores, py::handle labels) {
        return hetps::Metric(scores, labels, true);
      },
      py::arg("scores"), py::arg("labels"));
  m.def(
      "logloss",
      [](py::handle p, py::handle labels) {
        return hetps::Metric(p, labels, false);
      },
      py::arg("p"), py::arg("labels"));
  m.def(
      "_query_status",
      [](const std::string& endpoint, const std::string& config,
         double timeout_s) {
        hetps::JobConfig job = hetps::Value(hetps::BuildJobConfig(config, {}));
        hetps::Check(hetps::ValidateJobConfig(job));
        hetps::Check(hetps::ResolveCredentials(job, std::getenv));
        absl::StatusOr<hetps::rpc::StatusResponse> status;
        {
          py::gil_scoped_release release;
          status = hetps::QueryStatus(endpoint, timeout_s, job.credentials);
        }
        return hetps::StatusToJson(hetps::Value(std::move(status))).dump();
      },
      py::arg("endpoint"), py::arg("config") = "", py::arg("timeout_s") = 10.0);
}
