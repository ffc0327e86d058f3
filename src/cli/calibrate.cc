#include "cli/calibrate.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/roles.h"
#include "common/file.h"
#include "common/logging.h"
#include "coord/window_controller.h"

namespace hetps {
namespace {

constexpr double kDriftBelow = 0.85;
constexpr double kPushShareOfCompute = 0.25;
constexpr double kBusyServerCpu = 0.7;
constexpr double kTargetShare = 0.995;

// Two significant digits: a measured 1013 samples/s is a 1000 profile.
double TwoDigits(double x) {
  if (x <= 0) return 0;
  const double scale = std::pow(10.0, std::floor(std::log10(x)) - 1);
  return std::round(x / scale) * scale;
}

int Exit(const std::string& why) {
  std::fprintf(stderr, "hetps calibrate: %s\n", why.c_str());
  return kExitFailure;
}

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) {
    return absl::DataLossError(absl::StrCat(path, ": not JSON"));
  }
  return j;
}

// Seconds until rank 0's evaluations first reached `target` (-1: never).
double TimeTo(const nlohmann::json& summary, double target) {
  for (const nlohmann::json& e :
       summary.value("evals", nlohmann::json::array())) {
    if (e.value("auc", 0.0) >= target) return e.value("at_s", -1.0);
  }
  return -1;
}

}  // namespace

nlohmann::json TuneJob(const JobConfig& config, const nlohmann::json& summary) {
  nlohmann::json out;
  nlohmann::json& comments = out["comments"] = nlohmann::json::array();
  const int workers = config.num_workers();
  std::vector<nlohmann::json> cal(workers);
  std::vector<double> rate(workers, 0), bytes_per_push(workers, 0);
  for (const nlohmann::json& w : summary.at("per_worker")) {
    const int r = w.at("rank").get<int>();
    if (r < 0 || r >= workers || !w.contains("calibration")) continue;
    cal[r] = w["calibration"];
    rate[r] = TwoDigits(cal[r].value("samples_per_s", 0.0));
    const uint64_t pushes = w.value("pushes", uint64_t{0});
    if (pushes > 0) {
      bytes_per_push[r] =
          w.value("raw_bytes", 0.0) / static_cast<double>(pushes);
    }
  }
  for (int r = 0; r < workers; ++r) {
    if (rate[r] <= 0) {
      out["error"] = absl::StrCat("worker ", r, " measured nothing");
      return out;
    }
  }
  const double total = std::accumulate(rate.begin(), rate.end(), 0.0);
  const double slowest = *std::min_element(rate.begin(), rate.end());
  out["workers"] = nlohmann::json::array();
  for (int r = 0; r < workers; ++r) {
    out["workers"].push_back(
        {{"rank", r},
         {"samples_per_s", cal[r].value("samples_per_s", 0.0)},
         {"best_batch", cal[r].value("best_batch", 0)},
         {"max_batch", cal[r].value("max_batch", 0)},
         {"memory_capped", cal[r].value("memory_capped", false)},
         {"link_mbps", cal[r].value("link_mbps", nlohmann::json::array())},
         {"drift", cal[r].value("drift", 1.0)}});
  }

  // device_profiles: the measured rates; memory, link and schedule kept.
  using Key = std::tuple<double, double, double>;
  std::map<Key, std::vector<int>> groups;
  for (int r = 0; r < workers; ++r) {
    const DeviceProfileConfig* p = config.ProfileOf(r);
    // An emulated link (the profile's bandwidth_mbps) as measured; a real
    // one is not throttled.
    double link = p ? p->bandwidth_mbps : 0;
    const auto& links = cal[r].value("link_mbps", std::vector<double>{});
    if (link > 0 && !links.empty()) {
      link = TwoDigits(*std::min_element(links.begin(), links.end()));
    }
    groups[{rate[r], p ? p->memory_mb : 0, link}].push_back(r);
  }
  out["device_profiles"] = nlohmann::json::array();
  for (const auto& [key, ranks] : groups) {
    const auto& [throughput, memory, link] = key;
    nlohmann::json p = {{"ranks", ranks}, {"throughput", throughput}};
    if (memory > 0) p["memory_mb"] = memory;
    if (link > 0) p["bandwidth_mbps"] = link;
    out["device_profiles"].push_back(p);
    comments.push_back(absl::StrFormat(
        "device_profiles: workers %s compute %.0f samples/s (measured, two "
        "digits)%s",
        absl::StrJoin(ranks, ","), throughput,
        link > 0 ? absl::StrFormat("; link %.0f Mbit/s", link) : ""));
  }

  // train.batch_size: enough for the slowest worker's best batch.
  const bool proportional = config.ProportionalBatches();
  int slow = 0;
  for (int r = 0; r < workers; ++r) {
    if (rate[r] < rate[slow]) slow = r;
  }
  const int best_slow = cal[slow].value("best_batch", 0);
  int batch = config.train.batch_size;
  const auto share = [&](int r, int b) {
    return proportional ? b * workers * rate[r] / total : double(b);
  };
  if (share(slow, batch) < best_slow) {
    batch = static_cast<int>(std::ceil(
        proportional ? best_slow * total / (workers * slowest) : best_slow));
    comments.push_back(absl::StrFormat(
        "train.batch_size: %d, raised from %d so that the slowest worker "
        "(%d) gets its best batch %d",
        batch, config.train.batch_size, slow, best_slow));
  } else {
    comments.push_back(absl::StrFormat(
        "train.batch_size: %d kept: the slowest worker's share (%.0f) is at "
        "least its best batch (%d: within 90%% of its fastest rate)",
        batch, share(slow, batch), best_slow));
  }
  out["batch_size"] = batch;
  comments.push_back(
      "push_freq: left to the planner (it accumulates batches where memory "
      "caps one)");

  // window: the initial one for these rates.
  if (config.mode == ConsistencyMode::kSemiAsync) {
    JobConfig automatic = config;
    automatic.window = 0;
    const uint32_t window = InitialWindow(automatic, rate);
    out["window"] = window;
    comments.push_back(absl::StrFormat(
        "window: %d = sum of the rates / the slowest (%.0f / %.0f), still "
        "adapting",
        window, total, slowest));
  }

  // cluster.servers: the 1/5-1/3 rule, one more when one was saturated.
  const int low = (workers + 4) / 5, high = (workers + 2) / 3;
  int servers =
      std::clamp(static_cast<int>(std::lround(workers / 4.0)), low, high);
  bool saturated = false;
  for (const nlohmann::json& d :
       summary.value("diagnostics", nlohmann::json::array())) {
    saturated |= d.value("kind", "") == "server_saturated";
  }
  // The busiest server's CPU over the calibration, of what it may use.
  double busiest = 0;
  const double wall_s = summary.value("wall_s", 0.0);
  for (const nlohmann::json& c :
       summary.value("server_cpu", nlohmann::json::array())) {
    const double cpus = c.value("allowed_cpus", 0.0);
    if (wall_s > 0 && cpus > 0) {
      busiest = std::max(busiest, c.value("cpu_s", 0.0) / (wall_s * cpus));
    }
  }
  const bool busy = saturated || busiest >= kBusyServerCpu;
  if (busy) ++servers;
  out["servers"] = servers;
  out["busiest_server_cpu"] = busiest;
  comments.push_back(absl::StrFormat(
      "cluster.servers: %d for %d workers (a quarter, within [%d, %d]); the "
      "busiest server used %.0f%% of its CPUs while calibrating%s",
      servers, workers, low, high, 100 * busiest,
      saturated ? ", one more: a server was saturated"
      : busy    ? ", one more: above 70%"
                : ""));

  // compress.codec: adaptive where a push outlasts a quarter of compute.
  std::string codec = config.compress.codec;
  std::string why = "every push takes under a quarter of its compute";
  for (int r = 0; r < workers; ++r) {
    const auto& links = cal[r].value("link_mbps", std::vector<double>{});
    if (links.empty() || bytes_per_push[r] <= 0) continue;
    const double link = *std::min_element(links.begin(), links.end());
    const double push_s = bytes_per_push[r] * 8 / (link * 1e6);
    const double compute_s = share(r, batch) / rate[r];
    if (push_s > kPushShareOfCompute * compute_s) {
      codec = "adaptive";
      why = absl::StrFormat(
          "worker %d's push (%.0f KB) takes %.1f ms over %.0f Mbit/s, more "
          "than a quarter of its %.1f ms of compute",
          r, bytes_per_push[r] / 1e3, 1e3 * push_s, link, 1e3 * compute_s);
      break;
    }
  }
  out["codec"] = codec;
  comments.push_back(absl::StrFormat("compress.codec: %s: %s", codec, why));

  out["drift"] = nlohmann::json::array();
  for (int r = 0; r < workers; ++r) {
    const double drift = cal[r].value("drift", 1.0);
    if (drift < kDriftBelow) {
      out["drift"].push_back({{"rank", r}, {"drift", drift}});
      comments.push_back(absl::StrFormat(
          "DRIFT: worker %d slowed to %.0f%% of its starting rate over the "
          "sustained run (throttling? a noisy neighbour?)",
          r, 100 * drift));
    }
  }
  return out;
}

int RunCalibrate(const JobConfig& config, const CalibrateOptions& options) {
  namespace fs = std::filesystem;
  const fs::path run_dir =
      options.run_dir.empty()
          ? fs::path("runs") /
                absl::StrCat(config.name, "-calibrate-",
                             absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(),
                                              absl::UTCTimeZone()))
          : fs::path(options.run_dir);
  const std::string out_path =
      options.out.empty()
          ? (fs::path(options.config_path).parent_path() /
             (fs::path(options.config_path).stem().string() + ".tuned.yaml"))
                .string()
          : options.out;

  // 1. Every worker calibrates, on enough epochs of data to run out of
  //    time first.
  std::printf("calibrating: %d workers, %d servers, %.0f s each\n",
              config.num_workers(), config.num_servers(), options.seconds);
  std::fflush(stdout);
  JobConfig calibration = config;
  calibration.train.epochs = 1000;
  calibration.train.eval_every_s = 0;
  LaunchOptions launch;
  launch.self_path = options.self_path;
  launch.config_path = options.config_path;
  launch.overrides = options.overrides;
  launch.overrides.push_back("train.epochs=1000");
  launch.overrides.push_back("train.eval_every_s=0");
  launch.worker_args = {"--calibrate-seconds", absl::StrCat(options.seconds)};
  launch.live_status = false;
  launch.run_dir = (run_dir / "calibration").string();
  if (int code = RunLaunch(calibration, launch); code != kExitOk) {
    return Exit(absl::StrCat("the calibration run failed (logs in ",
                             launch.run_dir, ")"));
  }
  auto summary = ReadJson((run_dir / "calibration" / "summary.json").string());
  if (!summary.ok()) return Exit(std::string(summary.status().message()));
  const nlohmann::json tuned = TuneJob(config, *summary);
  if (tuned.contains("error")) return Exit(tuned["error"]);

  std::printf("\n%-7s %12s %6s %6s %-22s %6s\n", "worker", "samples/s", "best",
              "max", "link Mbit/s (servers)", "drift");
  for (const nlohmann::json& w : tuned["workers"]) {
    std::vector<std::string> links;
    for (double l : w["link_mbps"]) links.push_back(absl::StrFormat("%.0f", l));
    std::printf("%-7d %12.0f %6d %5d%s %-22s %6.2f\n", w["rank"].get<int>(),
                w["samples_per_s"].get<double>(), w["best_batch"].get<int>(),
                w["max_batch"].get<int>(),
                w["memory_capped"].get<bool>() ? "*" : " ",
                absl::StrJoin(links, " ").c_str(), w["drift"].get<double>());
  }
  for (const nlohmann::json& d : tuned["drift"]) {
    std::printf("drift: worker %d slowed to %.0f%% of its starting rate\n",
                d["rank"].get<int>(), 100 * d["drift"].get<double>());
  }

  // 2. The tuned file: the job's YAML with the choices, a comment each.
  YAML::Node doc = YAML::LoadFile(options.config_path);
  YAML::Node profiles(YAML::NodeType::Sequence);
  for (const nlohmann::json& p : tuned["device_profiles"]) {
    YAML::Node node;
    YAML::Node ranks(YAML::NodeType::Sequence);
    ranks.SetStyle(YAML::EmitterStyle::Flow);
    for (int r : p["ranks"]) ranks.push_back(r);
    node["ranks"] = ranks;
    node["throughput"] = p["throughput"].get<double>();
    if (p.contains("memory_mb"))
      node["memory_mb"] = p["memory_mb"].get<double>();
    if (p.contains("bandwidth_mbps")) {
      node["bandwidth_mbps"] = p["bandwidth_mbps"].get<double>();
    }
    profiles.push_back(node);
  }
  doc["device_profiles"] = profiles;
  doc["train"]["batch_size"] = tuned["batch_size"].get<int>();
  if (tuned.contains("window")) doc["window"] = tuned["window"].get<int>();
  doc["cluster"]["servers"] = tuned["servers"].get<int>();
  doc["compress"]["codec"] = tuned["codec"].get<std::string>();
  // Paths as the calibrated job resolved them: the file may move.
  doc["train"]["data"]["path"] = config.train.data.path;
  std::string text = absl::StrCat(
      "# Tuned by `hetps calibrate ", options.config_path, "` (",
      absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::Now(), absl::UTCTimeZone()),
      ", ", options.seconds, " s per worker):\n");
  for (const std::string& o : options.overrides) {
    absl::StrAppend(&text, "#   calibrated with --set ", o,
                    " (not carried here)\n");
  }
  for (const nlohmann::json& c : tuned["comments"]) {
    absl::StrAppend(&text, "# ", c.get<std::string>(), "\n");
  }
  YAML::Emitter emitter;
  emitter << doc;
  absl::StrAppend(&text, emitter.c_str(), "\n");
  {
    std::ofstream file(out_path);
    file << text;
    if (!file) return Exit("cannot write " + out_path);
  }
  std::printf("wrote %s\n", out_path.c_str());
  {
    std::ofstream json(run_dir / "tuning.json");
    json << tuned.dump(2) << "\n";
  }
  if (!options.compare) return kExitOk;

  // 3. Both jobs, one after the other: time to the target AUC.
  nlohmann::json results;
  for (const auto& [label, path] :
       {std::pair<std::string, std::string>{"original", options.config_path},
        {"tuned", out_path}}) {
    auto job = BuildJobConfig(path, options.overrides);
    if (!job.ok()) return Exit(std::string(job.status().message()));
    if (auto shape = ValidateAndResolve(*job); !shape.ok()) {
      return Exit(absl::StrCat(path, ": ", shape.status().message()));
    }
    LaunchOptions run;
    run.self_path = options.self_path;
    run.config_path = path;
    run.overrides = options.overrides;
    run.live_status = false;
    run.run_dir = (run_dir / label).string();
    std::printf("\nrunning the %s job (%s)\n", label.c_str(), path.c_str());
    std::fflush(stdout);
    if (int code = RunLaunch(*job, run); code != kExitOk) {
      return Exit(absl::StrCat("the ", label, " job failed"));
    }
    auto s = ReadJson((run_dir / label / "summary.json").string());
    if (!s.ok()) return Exit(std::string(s.status().message()));
    results[label] = *s;
  }
  const double best = std::max(results["original"].value("test_auc", 0.0),
                               results["tuned"].value("test_auc", 0.0));
  const double target = kTargetShare * best;
  nlohmann::json comparison = {{"target_auc", target}};
  std::printf("\n%-9s %9s %10s %16s\n", "job", "test AUC", "wall s",
              "s to AUC target");
  for (const char* label : {"original", "tuned"}) {
    const nlohmann::json& s = results[label];
    const double to = TimeTo(s, target);
    comparison[label] = {{"test_auc", s.value("test_auc", 0.0)},
                         {"wall_s", s.value("wall_s", 0.0)},
                         {"time_to_target_s", to}};
    std::printf("%-9s %9.4f %10.1f %16s\n", label, s.value("test_auc", 0.0),
                s.value("wall_s", 0.0),
                to < 0 ? "never" : absl::StrFormat("%.1f", to).c_str());
  }
  std::printf("target: %.4f (99.5%% of the better final AUC)\n", target);
  std::ofstream json(run_dir / "comparison.json");
  json << comparison.dump(2) << "\n";
  return kExitOk;
}

}  // namespace hetps
