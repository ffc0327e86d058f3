#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/calibrate.h"
#include "nlohmann/json.hpp"

namespace hetps {
namespace {

using ::testing::HasSubstr;

// The reference cluster's config: 10 workers, semi_async, batch 64.
JobConfig Reference(int batch_size) {
  auto config = ParseJobConfigYaml(
      "mode: semi_async\ncluster: {servers: 3, workers: 10}\ntrain: "
      "{batch_size: " +
      std::to_string(batch_size) + "}\n");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// A calibration summary: workers 0-2 at 1000 samples/s, the rest at 300;
// every push 20 KB, every link `link_mbps`.
nlohmann::json Summary(double link_mbps, int best_batch = 16) {
  nlohmann::json per_worker = nlohmann::json::array();
  for (int r = 0; r < 10; ++r) {
    per_worker.push_back({{"rank", r},
                          {"pushes", 100},
                          {"raw_bytes", 2000000},
                          {"calibration",
                           {{"samples_per_s", r < 3 ? 1013.0 : 297.0},
                            {"best_batch", best_batch},
                            {"max_batch", 512},
                            {"link_mbps", {link_mbps, link_mbps, link_mbps}},
                            {"drift", r == 9 ? 0.4 : 0.98}}}});
  }
  return {
      {"per_worker", per_worker},
      {"diagnostics", nlohmann::json::array()},
      {"wall_s", 20.0},
      {"server_cpu", {{{"rank", 0}, {"cpu_s", 4.0}, {"allowed_cpus", 2.0}}}}};
}

TEST(CalibrateTuneTest, TheReferenceKeepsItsShapeAndNamesTheDrift) {
  const nlohmann::json tuned = TuneJob(Reference(64), Summary(1000));
  ASSERT_FALSE(tuned.contains("error")) << tuned;
  // Two digits: 1013 → 1000, 297 → 300.
  ASSERT_EQ(tuned["device_profiles"].size(), 2u) << tuned;
  EXPECT_EQ(tuned["device_profiles"][0]["throughput"], 300.0);
  EXPECT_EQ(tuned["device_profiles"][1]["ranks"], nlohmann::json({0, 1, 2}));
  EXPECT_EQ(tuned["batch_size"], 64);
  EXPECT_EQ(tuned["window"], 17);  // 5100 / 300
  EXPECT_EQ(tuned["servers"], 3);  // 10 / 4, within [2, 4]; 10% CPU
  EXPECT_THAT(tuned["comments"].dump(), HasSubstr("used 10% of its CPUs"));
  EXPECT_EQ(tuned["codec"], "none");
  ASSERT_EQ(tuned["drift"].size(), 1u);
  EXPECT_EQ(tuned["drift"][0]["rank"], 9);
  EXPECT_THAT(tuned["comments"].dump(), HasSubstr("DRIFT: worker 9"));
}

TEST(CalibrateTuneTest, TheSlowestWorkersBestBatchRaisesTheJobsBatch) {
  // Its share of 16 × 10 at 300 / 5100 is 9.4, below its best 16.
  const nlohmann::json tuned = TuneJob(Reference(16), Summary(1000, 16));
  EXPECT_EQ(tuned["batch_size"], 28);  // ceil(16 × 5100 / (10 × 300))
  EXPECT_THAT(tuned["comments"].dump(), HasSubstr("raised from 16"));
}

TEST(CalibrateTuneTest, ANarrowLinkTurnsOnTheAdaptiveCodec) {
  // A 20 KB push over 2 Mbit/s: 80 ms, against a fast worker's
  // 64 × 10 × 1000 / 5100 / 1000 = 125 ms of compute.
  const nlohmann::json tuned = TuneJob(Reference(64), Summary(2));
  EXPECT_EQ(tuned["codec"], "adaptive");
  EXPECT_THAT(tuned["comments"].dump(), HasSubstr("over 2 Mbit/s"));
}

TEST(CalibrateTuneTest, ASaturatedServerAddsOne) {
  nlohmann::json summary = Summary(1000);
  summary["diagnostics"].push_back({{"kind", "server_saturated"}});
  EXPECT_EQ(TuneJob(Reference(64), summary)["servers"], 4);
}

TEST(CalibrateTuneTest, AServerBusyAboveSeventyPercentAddsOne) {
  nlohmann::json summary = Summary(1000);
  summary["server_cpu"][0]["cpu_s"] = 30.0;  // 75% of 2 CPUs over 20 s
  const nlohmann::json tuned = TuneJob(Reference(64), summary);
  EXPECT_EQ(tuned["servers"], 4);
  EXPECT_THAT(tuned["comments"].dump(), HasSubstr("used 75% of its CPUs"));
}

TEST(CalibrateTuneTest, AWorkerThatMeasuredNothingIsAnError) {
  nlohmann::json summary = Summary(1000);
  summary["per_worker"][4]["calibration"]["samples_per_s"] = 0;
  EXPECT_EQ(TuneJob(Reference(64), summary)["error"],
            "worker 4 measured nothing");
}

}  // namespace
}  // namespace hetps
