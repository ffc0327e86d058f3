// bench/compress: what gradient compression costs and saves, through the
// cluster, on generated Criteo data (issue 5).
//   codecs     the job of --config with compress.codec none / fp16 / int8 /
//              sparse+int8, each with and without error feedback: gradient
//              bytes as fp32 and as sent, the ratio, final test AUC;
//   slow_link  the same job with 4 workers, 2 of them behind an emulated
//              100 Mbit/s link: codec none against adaptive, time to a
//              target AUC (99.5% of the better final AUC) and samples/s.
// Prints (and writes to --out) one JSON document.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launch_runner.h"
#include "nlohmann/json.hpp"

namespace {

using hetps::bench::Curve;
using hetps::bench::Json;
using hetps::bench::Launch;
using hetps::bench::RunResult;
using hetps::bench::TimeToTarget;

Json Summarize(const RunResult& run, const std::string& log) {
  Json r = {{"exit_code", run.exit_code}, {"log", log}};
  const Json& s = run.summary;
  if (run.exit_code != 0 || !s.is_object() || !s.contains("test_auc")) return r;
  r["final_auc"] = s["test_auc"];
  r["gradient_bytes_raw"] = s["gradient_bytes_raw"];
  r["gradient_bytes_sent"] = s["gradient_bytes_sent"];
  r["compression_ratio"] = s["compression_ratio"];
  r["gradient_value_bytes_raw"] = s["gradient_value_bytes_raw"];
  r["gradient_value_bytes_sent"] = s["gradient_value_bytes_sent"];
  r["value_compression_ratio"] = s["value_compression_ratio"];
  r["sent_by_codec"] = s["sent_by_codec"];
  r["samples_per_s"] = s["samples_per_s"];
  r["wall_s"] = s["wall_s"];
  r["warnings"] = s["warnings"];
  r["curve"] = Curve(s);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string hetps = HETPS_BINARY;
  std::string config;
  std::string out;
  std::vector<std::string> scenarios = {"codecs", "slow_link"};
  std::vector<std::string> extra;
  CLI::App app("hetps gradient-compression benchmark");
  app.add_option("--config", config, "job YAML (criteo data)")->required();
  app.add_option("--hetps", hetps, "the hetps binary");
  app.add_option("--out", out, "write the JSON results here too");
  app.add_option("--scenarios", scenarios, "codecs, slow_link")->delimiter(',');
  app.add_option("--set", extra, "more overrides for every run");
  CLI11_PARSE(app, argc, argv);

  const std::string work = absl::StrCat("/tmp/compress-bench-", getpid());
  std::filesystem::create_directories(work);
  Json results = {{"config", config}, {"scenarios", Json::object()}};
  auto run = [&](const std::string& name, std::vector<std::string> sets) {
    sets.insert(sets.end(), extra.begin(), extra.end());
    const std::string log = absl::StrCat(work, "/", name, ".log");
    std::cerr << name << " ...\n";
    Json r = Summarize(Launch(hetps, config, sets, log), log);
    std::cerr << "  " << r.dump().substr(0, 300) << "\n";
    return r;
  };

  for (const std::string& scenario : scenarios) {
    Json& sc = results["scenarios"][scenario];
    if (scenario == "codecs") {
      for (const char* codec : {"none", "fp16", "int8", "sparse+int8"}) {
        for (bool feedback : {true, false}) {
          if (std::string(codec) == "none" && !feedback) continue;
          const std::string name =
              absl::StrCat(codec, feedback ? "" : " (no error feedback)");
          std::vector<std::string> sets = {
              absl::StrCat("compress.codec=", codec),
              absl::StrCat("compress.error_feedback=",
                           feedback ? "true" : "false")};
          if (std::string(codec) == "sparse+int8") {
            sets.push_back("compress.keep_fraction=0.25");
          }
          sc[name] =
              run(absl::StrCat("codecs-", codec, feedback ? "-ef" : ""), sets);
        }
      }
    } else if (scenario == "slow_link") {
      const std::vector<std::string> cluster = {
          "cluster.workers=4",
          "device_profiles=[{ranks: [2, 3], bandwidth_mbps: 100}]",
          "train.eval_every_s=1"};
      for (const char* codec : {"none", "adaptive"}) {
        std::vector<std::string> sets = cluster;
        sets.push_back(absl::StrCat("compress.codec=", codec));
        sc[codec] = run(absl::StrCat("slow-link-", codec), sets);
      }
      double best = 0;
      for (const auto& [name, r] : sc.items()) {
        best = std::max(best, r.value("final_auc", 0.0));
      }
      const double target = 0.995 * best;
      sc["target_auc"] = target;
      for (const char* codec : {"none", "adaptive"}) {
        Json& r = sc[codec];
        if (!r.contains("curve")) continue;
        const auto t = TimeToTarget(r["curve"], target);
        r["time_to_target_s"] = t ? Json(*t) : Json(nullptr);
      }
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
  }
  const std::string text = results.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}
