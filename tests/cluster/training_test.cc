// Real training through the cluster: readers, models and metrics end to end,
// each job a `hetps launch` of real processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "model/criteo_gen.h"
#include "nlohmann/json.hpp"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::TempDir;

TEST(TrainingTest, MovieLensDeepFmReachesTheAucBarInOneEpoch) {
  TempDir dir;
  const testing::LaunchedJob run = testing::LaunchJob(
      dir, testing::SourcePath("examples/movielens.yaml"), {"train.epochs=1"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  EXPECT_EQ(run.summary["model"], "deepfm");
  EXPECT_EQ(run.summary["workers"], 4);
  // ~90% of 100836 ratings are trained on, once.
  EXPECT_GT(run.summary["samples"].get<uint64_t>(), 88000u);
  EXPECT_LT(run.summary["samples"].get<uint64_t>(), 93000u);
  EXPECT_EQ(run.summary["malformed_records"], 0);
  EXPECT_GE(run.summary["test_auc"].get<double>(), 0.785);
  EXPECT_LT(run.summary["test_logloss"].get<double>(), 0.65);
}

TEST(TrainingTest, OneAndFourSyncWorkersReachTheSameAuc) {
  // The same global batch (1 × 1024 vs 4 × 256) in sync mode is the same
  // optimisation up to the order of samples inside a round.
  TempDir dir;
  const std::string config = testing::SourcePath("examples/movielens.yaml");
  const testing::LaunchedJob one =
      testing::LaunchJob(dir, config,
                         {"train.epochs=1", "train.model=fm",
                          "cluster.workers=1", "train.batch_size=1024"});
  ASSERT_EQ(one.result.exit_code, 0) << one.result.output;
  const testing::LaunchedJob four =
      testing::LaunchJob(dir, config,
                         {"train.epochs=1", "train.model=fm",
                          "cluster.workers=4", "train.batch_size=256"});
  ASSERT_EQ(four.result.exit_code, 0) << four.result.output;
  const double a = one.summary["test_auc"].get<double>();
  const double b = four.summary["test_auc"].get<double>();
  EXPECT_GT(a, 0.7);
  EXPECT_NEAR(a, b, 0.005) << "1 worker " << a << ", 4 workers " << b;
}

TEST(TrainingTest, DeepFmComesCloseToTheTeacherOnGeneratedCriteo) {
  // The example job on 600k generated samples (the documented run uses 2M
  // and lands within 0.01; with 600k the rare ids are still under-trained
  // and the measured gap is ~0.015).
  TempDir dir;
  CriteoGenConfig gen;
  gen.samples = 600000;
  gen.vocab = 100;
  gen.seed = 1;
  const std::string data = dir.path() + "/criteo.tsv";
  absl::StatusOr<CriteoGenReport> teacher = GenerateCriteo(gen, data);
  ASSERT_TRUE(teacher.ok()) << teacher.status();
  ASSERT_GT(teacher->teacher_auc, 0.79);
  const testing::LaunchedJob run = testing::LaunchJob(
      dir, testing::SourcePath("examples/criteo-synthetic.yaml"),
      {absl::StrCat("train.data.path=", data)});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  EXPECT_EQ(run.summary["model"], "deepfm");
  const double auc = run.summary["test_auc"].get<double>();
  EXPECT_GT(auc, teacher->teacher_auc - 0.02)
      << "teacher " << teacher->teacher_auc;
  EXPECT_LT(auc, teacher->teacher_auc + 0.01)
      << "no model beats the teacher by more than the test set's noise";
}

// 60k generated Criteo samples (vocab 100) in `dir`.
std::string SmallCriteo(const TempDir& dir) {
  CriteoGenConfig gen;
  gen.samples = 60000;
  gen.vocab = 100;
  const std::string data = dir.path() + "/criteo.tsv";
  EXPECT_TRUE(GenerateCriteo(gen, data).ok());
  return data;
}

TEST(TrainingTest, Int8WithErrorFeedbackSendsFewerBytesAtTheSameAuc) {
  // DeepFM on generated Criteo data, uncompressed and int8 + error feedback,
  // the example's three epochs (after one the model is still on the steep
  // part of its curve, where a run's AUC moves by ±0.005 with chunk order).
  TempDir dir;
  const std::string data = SmallCriteo(dir);
  const std::string config =
      testing::SourcePath("examples/criteo-synthetic.yaml");
  const std::vector<std::string> common = {
      absl::StrCat("train.data.path=", data), "mode=sync"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  const testing::LaunchedJob fp32 =
      testing::LaunchJob(dir, config, with({"compress.codec=none"}));
  ASSERT_EQ(fp32.result.exit_code, 0) << fp32.result.output;
  const std::string reference = dir.path() + "/fp32.json";
  {
    std::ofstream out(reference);
    out << fp32.summary.dump();
  }
  const testing::LaunchedJob int8 = testing::LaunchJob(
      dir, config,
      with({"compress.codec=int8", "compress.error_feedback=true",
            absl::StrCat("compress.reference_summary=", reference)}));
  ASSERT_EQ(int8.result.exit_code, 0) << int8.result.output;
  EXPECT_EQ(fp32.summary["compression_ratio"].get<double>(), 1.0);
  EXPECT_EQ(fp32.summary["gradient_bytes_raw"],
            fp32.summary["gradient_bytes_sent"]);
  // Same work, same raw bytes; int8 sends about a third (keys stay 8 bytes).
  EXPECT_EQ(int8.summary["gradient_bytes_raw"],
            fp32.summary["gradient_bytes_raw"]);
  EXPECT_GT(int8.summary["compression_ratio"].get<double>(), 2.5);
  // The gradient values alone: int8 with one f32 scale per 256 values.
  EXPECT_EQ(fp32.summary["gradient_value_bytes_raw"],
            int8.summary["gradient_value_bytes_raw"]);
  EXPECT_GT(int8.summary["value_compression_ratio"].get<double>(), 3.8);
  EXPECT_LT(int8.summary["value_compression_ratio"].get<double>(), 4.0);
  EXPECT_GT(int8.summary["sent_by_codec"]["int8"].get<uint64_t>(), 0u);
  // int8 loses no accuracy worth the name (it may gain some: its rounding
  // noise measured +0.005 here).
  EXPECT_GT(int8.summary["test_auc"].get<double>(),
            fp32.summary["test_auc"].get<double>() - 0.005);
  EXPECT_TRUE(int8.summary["warnings"].empty()) << int8.summary["warnings"];
}

TEST(TrainingTest, OverCompressionIsFlagged) {
  // Top 1% of rows without error feedback against an fp32 reference: the
  // loss falls far slower, and the worker says so.
  TempDir dir;
  const std::string data = SmallCriteo(dir);
  const std::string config =
      testing::SourcePath("examples/criteo-synthetic.yaml");
  // Small batches: enough steps for the check (every 20 steps from 100).
  const std::vector<std::string> common = {
      absl::StrCat("train.data.path=", data), "train.epochs=1", "mode=sync",
      "train.batch_size=32"};
  const testing::LaunchedJob fp32 = testing::LaunchJob(dir, config, common);
  ASSERT_EQ(fp32.result.exit_code, 0) << fp32.result.output;
  const std::string reference = dir.path() + "/fp32.json";
  std::ofstream(reference) << fp32.summary.dump();
  std::vector<std::string> sets = common;
  sets.push_back("compress.codec=sparse+int8");
  sets.push_back("compress.keep_fraction=0.01");
  sets.push_back("compress.error_feedback=false");
  sets.push_back(absl::StrCat("compress.reference_summary=", reference));
  const testing::LaunchedJob harsh = testing::LaunchJob(dir, config, sets);
  ASSERT_EQ(harsh.result.exit_code, 0) << harsh.result.output;
  EXPECT_THAT(harsh.result.output, HasSubstr("over-compression: loss"));
  ASSERT_FALSE(harsh.summary["warnings"].empty());
  // The coordinator's diagnostics carry it too (status, dashboard).
  const nlohmann::json& diagnostics = harsh.summary["diagnostics"];
  EXPECT_TRUE(std::any_of(diagnostics.begin(), diagnostics.end(),
                          [](const nlohmann::json& d) {
                            return d["kind"] == "over_compression";
                          }))
      << diagnostics;
}

std::string CriteoJob(const std::string& path) {
  return absl::StrCat(
      "name: criteo\nmode: sync\ncluster: {servers: 1, workers: 2}\n"
      "train:\n  model: fm\n  epochs: 1\n  data: {format: criteo, path: '",
      path, "'}\n");
}

TEST(TrainingTest, MalformedLinesAreCountedAndTheJobGoesOn) {
  TempDir dir;
  CriteoGenConfig gen;
  gen.samples = 3000;
  const std::string data = dir.path() + "/day.tsv";
  ASSERT_TRUE(GenerateCriteo(gen, data).ok());
  {
    std::ofstream out(data, std::ios::app);
    out << "1\t2\t3\n";                                // wrong column count
    out << "0\tabc" << std::string(38, '\t') << "\n";  // non-numeric integer
    out << "1\t5";                                     // truncated last line
  }
  const testing::LaunchedJob run =
      testing::LaunchJob(dir, dir.Write("job.yaml", CriteoJob(data)), {});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  // Every worker reads every line to find its share, and rank 0 reads the
  // test split too: each bad line is seen by the train readers of both
  // workers' shares or by the test reader, so count the reports instead.
  EXPECT_THAT(run.result.output, HasSubstr("day.tsv:3001"));
  EXPECT_THAT(run.result.output, HasSubstr("day.tsv:3003"));
  EXPECT_GT(run.summary["malformed_records"].get<uint64_t>(), 0u);
}

TEST(TrainingTest, AMostlyGarbageFileStopsTheJobWithAClearError) {
  TempDir dir;
  std::string garbage;
  for (int i = 0; i < 500; ++i) garbage += "this is not criteo\n";
  const std::string data = dir.Write("garbage.tsv", garbage);
  const testing::LaunchedJob run =
      testing::LaunchJob(dir, dir.Write("job.yaml", CriteoJob(data)), {});
  EXPECT_EQ(run.result.exit_code, 1) << run.result.output;
  // Each worker reads chunks of the file; the first chunk read stops it.
  EXPECT_THAT(run.result.output, HasSubstr("garbage.tsv: "));
  EXPECT_THAT(run.result.output, HasSubstr("records malformed (more than"));
  EXPECT_THAT(run.result.output,
              HasSubstr("is the file really in the 'criteo' format?"));
}

}  // namespace
}  // namespace hetps
