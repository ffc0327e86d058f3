#include "model/criteo_gen.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "data/batch.h"
#include "data/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hetps/config.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::hetps::testing::TempDir;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CriteoGenConfig SmallConfig() {
  CriteoGenConfig config;
  config.samples = 20000;
  config.seed = 11;
  return config;
}

TEST(CriteoGenTest, FileParsesCleanlyAndMatchesTheReport) {
  TempDir dir;
  const std::string path = dir.path() + "/gen.tsv";
  absl::StatusOr<CriteoGenReport> report = GenerateCriteo(SmallConfig(), path);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->samples, 20000u);
  EXPECT_GT(report->teacher_auc, 0.7);
  EXPECT_LT(report->teacher_auc, 0.95);
  const double positive_rate = static_cast<double>(report->positives) / 20000;
  EXPECT_GT(positive_rate, 0.18);
  EXPECT_LT(positive_rate, 0.32);
  // No temporary file is left next to it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);

  // Exactly 40 tab-separated fields on every line, which all end in '\n'.
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  size_t lines = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    const auto tabs =
        std::count(text.begin() + start, text.begin() + end, '\t');
    ASSERT_EQ(tabs, 39) << "line " << lines + 1;
    ++lines;
    start = end + 1;
  }
  EXPECT_EQ(lines, 20000u);

  DataConfig data;
  data.format = "criteo";
  data.path = path;
  data.test_fraction = 0;
  absl::StatusOr<std::unique_ptr<Reader>> reader =
      OpenReader(data, Split::kTrain, 0, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Batch batch;
  uint64_t samples = 0;
  uint64_t positives = 0;
  uint64_t empty_slots = 0;
  for (;;) {
    absl::StatusOr<size_t> n = (*reader)->Next(1024, &batch);
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == 0) break;
    samples += *n;
    for (size_t i = 0; i < *n; ++i) {
      positives += batch.labels[i] > 0.5f;
      for (int s = 0; s < 39; ++s) {
        const size_t keys = batch.SlotKeys(i, s).size();
        ASSERT_LE(keys, 1u);
        empty_slots += keys == 0;
      }
    }
  }
  EXPECT_EQ(samples, 20000u);
  EXPECT_EQ(positives, report->positives);
  EXPECT_EQ((*reader)->stats().malformed, 0u);
  // Fields go missing at the configured 5%.
  EXPECT_NEAR(static_cast<double>(empty_slots) / (20000.0 * 39), 0.05, 0.005);
}

TEST(CriteoGenTest, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir dir;
  CriteoGenConfig config = SmallConfig();
  config.samples = 3000;
  const std::string a = dir.path() + "/a.tsv";
  const std::string b = dir.path() + "/b.tsv";
  const std::string c = dir.path() + "/c.tsv";
  absl::StatusOr<CriteoGenReport> ra = GenerateCriteo(config, a);
  absl::StatusOr<CriteoGenReport> rb = GenerateCriteo(config, b);
  config.seed = 12;
  absl::StatusOr<CriteoGenReport> rc = GenerateCriteo(config, c);
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  EXPECT_EQ(ReadFile(a), ReadFile(b));
  EXPECT_EQ(ra->positives, rb->positives);
  EXPECT_EQ(ra->teacher_auc, rb->teacher_auc);
  EXPECT_NE(ReadFile(a), ReadFile(c));
}

TEST(CriteoGenTest, TheTeachersTwoPartsSetItsAuc) {
  // Without either part the labels are coin flips at the positive rate; each
  // part alone is a weaker teacher than both together.
  TempDir dir;
  CriteoGenConfig config = SmallConfig();
  config.samples = 20000;
  auto auc = [&](double linear, double pairs) {
    config.teacher_scale = linear;
    config.pair_scale = pairs;
    absl::StatusOr<CriteoGenReport> r =
        GenerateCriteo(config, dir.path() + "/t.tsv");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->teacher_auc : 0.0;
  };
  const double none = auc(0, 0);
  const double linear = auc(1, 0);
  const double pairs = auc(0, 1);
  const double both = auc(1, 1);
  EXPECT_NEAR(none, 0.5, 0.02);
  EXPECT_GT(linear, 0.65);
  EXPECT_GT(pairs, 0.6);
  EXPECT_GT(both, std::max(linear, pairs) + 0.02);
}

TEST(CriteoGenTest, RejectsBadConfigAndUnwritablePath) {
  TempDir dir;
  CriteoGenConfig config = SmallConfig();
  config.missing_rate = 1.0;
  EXPECT_THAT(
      GenerateCriteo(config, dir.path() + "/x"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing_rate")));
  config = SmallConfig();
  config.teacher_rank = 65;
  EXPECT_THAT(
      GenerateCriteo(config, dir.path() + "/x"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("teacher_rank")));
  config = SmallConfig();
  config.pair_scale = -1;
  EXPECT_THAT(
      GenerateCriteo(config, dir.path() + "/x"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pair_scale")));
  EXPECT_THAT(GenerateCriteo(SmallConfig(), dir.path() + "/no/such/dir/x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir")));
}

}  // namespace
}  // namespace hetps
