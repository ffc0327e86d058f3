#include "data/reader.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "data/batch.h"
#include "data/feature_key.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hetps/config.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::hetps::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// One sample, unpacked from a Batch for easy comparison.
struct Sample {
  float label = 0;
  std::vector<std::vector<uint64_t>> slots;
  std::vector<float> dense;
  bool operator==(const Sample&) const = default;
};

std::vector<Sample> Unpack(const Batch& b) {
  std::vector<Sample> out;
  for (size_t i = 0; i < b.size(); ++i) {
    Sample s;
    s.label = b.labels[i];
    for (int slot = 0; slot < b.num_slots; ++slot) {
      auto keys = b.SlotKeys(i, slot);
      s.slots.emplace_back(keys.begin(), keys.end());
    }
    s.dense.assign(b.dense.begin() + i * b.num_dense,
                   b.dense.begin() + (i + 1) * b.num_dense);
    out.push_back(std::move(s));
  }
  return out;
}

// Every sample of `reader`'s share, read `batch_size` at a time.
std::vector<Sample> Drain(Reader& reader, size_t batch_size = 5) {
  std::vector<Sample> all;
  Batch batch;
  for (;;) {
    absl::StatusOr<size_t> n = reader.Next(batch_size, &batch);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    EXPECT_LE(*n, batch_size);
    EXPECT_EQ(batch.size(), *n);
    EXPECT_EQ(batch.num_slots, reader.num_slots());
    EXPECT_EQ(batch.num_dense, reader.num_dense());
    EXPECT_EQ(batch.offsets.size(), *n * batch.num_slots + 1);
    EXPECT_EQ(batch.dense.size(), *n * batch.num_dense);
    for (Sample& s : Unpack(batch)) all.push_back(std::move(s));
  }
  return all;
}

DataConfig FileConfig(const std::string& format, const std::string& path) {
  DataConfig c;
  c.format = format;
  c.path = path;
  c.test_fraction = 0;  // every record in the train split
  c.shuffle_buffer = 0;  // file order (ReaderShuffleTest turns it on)
  return c;
}

std::unique_ptr<Reader> MustOpen(const DataConfig& c,
                                 Split split = Split::kTrain,
                                 uint32_t shard = 0, uint32_t shards = 1) {
  absl::StatusOr<std::unique_ptr<Reader>> r =
      OpenReader(c, split, shard, shards);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

uint64_t Hashed(uint32_t slot, const std::string& s) {
  return FeatureKey(slot, XXH3_64bits(s.data(), s.size()));
}

// The rule of data/reader.h, restated independently.
bool IsTestRecord(uint64_t seed, double fraction, uint64_t r) {
  return static_cast<double>(Mix64(seed ^ Mix64(r)) >> 11) * 0x1.0p-53 <
         fraction;
}

// ---------------------------------------------------------------- criteo

// A criteo line from 13 integer fields and 26 categorical ones ("" = missing).
std::string CriteoLine(const std::string& label,
                       const std::vector<std::string>& ints,
                       const std::vector<std::string>& cats) {
  return absl::StrCat(label, "\t", absl::StrJoin(ints, "\t"), "\t",
                      absl::StrJoin(cats, "\t"));
}

std::vector<std::string> SomeCats() {
  std::vector<std::string> cats;
  for (int c = 0; c < 26; ++c) cats.push_back(absl::StrCat("a1b2c3", 10 + c));
  return cats;
}

std::vector<std::string> SomeInts() {
  return {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13"};
}

TEST(ReaderCriteoTest, ParsesKeysLabelsAndDenseValuesExactly) {
  TempDir dir;
  const std::vector<std::string> ints = {"5", "0", "",  "-3",   "1", "2",  "3",
                                         "4", "7", "8", "1024", "",  "100"};
  // Bucket of each integer field: v<0 → -1, 0 → 0, else floor(log2 v) + 1.
  const std::vector<std::optional<int64_t>> buckets = {
      3, 0, std::nullopt, -1, 1, 2, 2, 3, 3, 4, 11, std::nullopt, 7};
  std::vector<std::string> cats = SomeCats();
  cats[0] = "68fd1e64";
  cats[1] = "";
  cats[25] = "";
  const std::string path =
      dir.Write("day0", CriteoLine("1", ints, cats) + "\n" +
                            CriteoLine("0", std::vector<std::string>(13, ""),
                                       std::vector<std::string>(26, "")) +
                            "\n");

  std::unique_ptr<Reader> reader = MustOpen(FileConfig("criteo", path));
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->num_slots(), 39);
  EXPECT_EQ(reader->num_dense(), 13);
  const std::vector<Sample> samples = Drain(*reader);
  ASSERT_EQ(samples.size(), 2u);

  Sample want;
  want.label = 1;
  for (int j = 0; j < 13; ++j) {
    want.slots.push_back({});
    if (buckets[j]) {
      want.slots.back().push_back(
          FeatureKey(j, static_cast<uint64_t>(*buckets[j])));
    }
  }
  for (int c = 0; c < 26; ++c) {
    want.slots.push_back({});
    if (!cats[c].empty()) want.slots.back().push_back(Hashed(13 + c, cats[c]));
  }
  for (int j = 0; j < 13; ++j) {
    int64_t v = 0;
    if (!ints[j].empty()) v = std::stoll(ints[j]);
    want.dense.push_back(static_cast<float>(
        std::log1p(static_cast<double>(v > 0 ? v : 0)) / 10));
  }
  EXPECT_EQ(samples[0], want);
  EXPECT_EQ(samples[0].slots[13],
            std::vector<uint64_t>{Hashed(13, "68fd1e64")});
  EXPECT_THAT(samples[0].slots[14], IsEmpty());
  EXPECT_FLOAT_EQ(samples[0].dense[10], std::log1p(1024.0) / 10);
  EXPECT_FLOAT_EQ(samples[0].dense[3], 0.0f);  // negative → 0

  // All fields missing: a sample with 39 empty slots and zero dense values.
  EXPECT_EQ(samples[1].label, 0);
  for (const auto& slot : samples[1].slots) EXPECT_THAT(slot, IsEmpty());
  EXPECT_EQ(samples[1].dense, std::vector<float>(13, 0.0f));

  EXPECT_EQ(reader->stats().records, 2u);
  EXPECT_EQ(reader->stats().samples, 2u);
  EXPECT_EQ(reader->stats().malformed, 0u);
}

TEST(ReaderCriteoTest, CountsMalformedLinesWithTheirLineNumbers) {
  TempDir dir;
  const std::string good = CriteoLine("0", SomeInts(), SomeCats());
  std::vector<std::string> bad_int = SomeInts();
  bad_int[2] = "12x";
  std::vector<std::string> bad_hex = SomeCats();
  bad_hex[4] = "zz";
  const std::string text = absl::StrCat(
      good, "\n",                                     // 1
      "1\t2\t3\n",                                    // 2: 3 fields
      good, "\n",                                     // 3
      CriteoLine("1", bad_int, SomeCats()), "\n",     // 4: I3 not a number
      CriteoLine("2", SomeInts(), SomeCats()), "\n",  // 5: label 2
      CriteoLine("1", SomeInts(), bad_hex), "\n",     // 6: C5 not hex
      "\n",                                           // 7: empty
      good, "\n",                                     // 8
      good.substr(0, 30));                            // 9: cut short
  const std::string path = dir.Write("bad.tsv", text);
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("criteo", path));
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Drain(*reader).size(), 3u);
  const ReaderStats& stats = reader->stats();
  EXPECT_EQ(stats.records, 9u);
  EXPECT_EQ(stats.samples, 3u);
  EXPECT_EQ(stats.malformed, 6u);
  EXPECT_THAT(
      stats.examples,
      ElementsAre(AllOf(StartsWith(path + ":2: "), HasSubstr("expected 40")),
                  AllOf(StartsWith(path + ":4: "), HasSubstr("I3")),
                  AllOf(StartsWith(path + ":5: "), HasSubstr("label")),
                  AllOf(StartsWith(path + ":6: "), HasSubstr("C5")),
                  path + ":7: empty line", path + ":9: truncated record"));
}

TEST(ReaderCriteoTest, AcceptsACompleteLastLineWithoutNewline) {
  TempDir dir;
  const std::string good = CriteoLine("1", SomeInts(), SomeCats());
  const std::string path =
      dir.Write("d", absl::StrCat(good, "\r\n", good));  // CRLF too
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("criteo", path));
  ASSERT_NE(reader, nullptr);
  const std::vector<Sample> samples = Drain(*reader);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0], samples[1]);
  EXPECT_EQ(reader->stats().malformed, 0u);
}

TEST(ReaderCriteoTest, MostlyGarbageFileStopsNamingFileAndFirstBadLine) {
  TempDir dir;
  const std::string good = CriteoLine("1", SomeInts(), SomeCats());
  std::string text;
  for (int i = 0; i < 300; ++i) {
    absl::StrAppend(&text, i % 3 == 1 ? "user,item,rating" : good, "\n");
  }
  const std::string path = dir.Write("garbage.csv", text);
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("criteo", path));
  ASSERT_NE(reader, nullptr);
  Batch batch;
  absl::StatusOr<size_t> n = reader->Next(1000, &batch);
  EXPECT_THAT(n, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr(path), HasSubstr("at line 2:"),
                                HasSubstr("max_bad_fraction"))));
  // The verdict stands on the next call, and again after a rewind.
  EXPECT_THAT(reader->Next(1000, &batch),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  ASSERT_TRUE(reader->Rewind().ok());
  EXPECT_THAT(
      reader->Next(1000, &batch),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at line 2:")));
}

TEST(ReaderCriteoTest, SmallFileWithNothingValidFailsAtTheEnd) {
  TempDir dir;
  const std::string path = dir.Write("tiny", "a,b\nc,d\n");
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("criteo", path));
  ASSERT_NE(reader, nullptr);
  Batch batch;
  EXPECT_THAT(reader->Next(10, &batch),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("at line 1:"))));
}

TEST(ReaderCriteoTest, ToleratesBadLinesBelowTheFraction) {
  TempDir dir;
  const std::string good = CriteoLine("1", SomeInts(), SomeCats());
  std::string text;
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&text, i % 50 == 7 ? "junk" : good, "\n");  // 2%
  }
  const std::string path = dir.Write("ok", text);
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("criteo", path));
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Drain(*reader, 64).size(), 980u);
  EXPECT_EQ(reader->stats().malformed, 20u);
  EXPECT_EQ(reader->stats().examples.size(), 10u);
  EXPECT_THAT(reader->stats().examples[0], StartsWith(path + ":8: "));
}

// ---------------------------------------------------------- libsvm, libfm

TEST(ReaderLibsvmTest, ParsesLabelsAndNonZeroFeatures) {
  TempDir dir;
  const std::string path =
      dir.Write("a.svm", "1 3:1 7:0.5 9:0\n-1 2:1\n+1\n0\t5:2  11:-1.5\n");
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("libsvm", path));
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->num_slots(), 1);
  EXPECT_EQ(reader->num_dense(), 0);
  const std::vector<Sample> s = Drain(*reader);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0], (Sample{1, {{FeatureKey(0, 3), FeatureKey(0, 7)}}, {}}));
  EXPECT_EQ(s[1], (Sample{0, {{FeatureKey(0, 2)}}, {}}));
  EXPECT_EQ(s[2], (Sample{1, {{}}, {}}));
  EXPECT_EQ(s[3], (Sample{0, {{FeatureKey(0, 5), FeatureKey(0, 11)}}, {}}));
}

TEST(ReaderLibsvmTest, CountsBadTokens) {
  TempDir dir;
  const std::string path =
      dir.Write("b.svm", "1 3:1\n2 3:1\n1 x:1\n1 3\n0 4:1\n1 4:1 5:");
  std::unique_ptr<Reader> reader = MustOpen(FileConfig("libsvm", path));
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Drain(*reader).size(), 2u);
  EXPECT_EQ(reader->stats().malformed, 4u);
  EXPECT_THAT(
      reader->stats().examples,
      ElementsAre(StartsWith(path + ":2: "), StartsWith(path + ":3: "),
                  StartsWith(path + ":4: "), path + ":6: truncated record"));
}

TEST(ReaderLibsvmTest, ReadsLinesLongerThanTheReadBuffer) {
  TempDir dir;
  // ~2.7 MB on one line, between two short ones.
  std::string text = "0 1:1\n1";
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < 300000; ++i) {
    absl::StrAppend(&text, " ", i, ":1");
    want.push_back(FeatureKey(0, i));
  }
  absl::StrAppend(&text, "\n1 2:1\n");
  std::unique_ptr<Reader> reader =
      MustOpen(FileConfig("libsvm", dir.Write("long.svm", text)));
  ASSERT_NE(reader, nullptr);
  const std::vector<Sample> s = Drain(*reader);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (Sample{0, {{FeatureKey(0, 1)}}, {}}));
  EXPECT_EQ(s[1], (Sample{1, {want}, {}}));
  EXPECT_EQ(s[2], (Sample{1, {{FeatureKey(0, 2)}}, {}}));
}

TEST(ReaderLibfmTest, GroupsFeaturesBySlot) {
  TempDir dir;
  const std::string path = dir.Write(
      "a.fm", "1 2:5:1 0:7:1 2:6:1 1:1:0\n0 3:1:1\n-1 0:x:1\n0 1:4:1\n");
  DataConfig config = FileConfig("libfm", path);
  config.libfm_slots = 3;
  std::unique_ptr<Reader> reader = MustOpen(config);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->num_slots(), 3);
  const std::vector<Sample> s = Drain(*reader);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(
      s[0],
      (Sample{1,
              {{FeatureKey(0, 7)}, {}, {FeatureKey(2, 5), FeatureKey(2, 6)}},
              {}}));
  EXPECT_EQ(s[1], (Sample{0, {{}, {FeatureKey(1, 4)}, {}}, {}}));
  EXPECT_EQ(reader->stats().malformed, 2u);
  EXPECT_THAT(reader->stats().examples,
              ElementsAre(AllOf(StartsWith(path + ":2: "),
                                HasSubstr("slot 3 out of range")),
                          StartsWith(path + ":3: ")));
}

// ------------------------------------------------------ split and sharding

// 10k libsvm records; record r has the single key FeatureKey(0, r).
std::string NumberedRecords(TempDir& dir, int n) {
  std::string text;
  for (int r = 0; r < n; ++r) absl::StrAppend(&text, r % 2, " ", r, ":1\n");
  return dir.Write("numbered.svm", text);
}

// The record numbers behind the samples of `reader` (keys of NumberedRecords
// files below `limit`).
std::vector<uint64_t> RecordsOf(Reader& reader, uint64_t limit = 10000) {
  std::map<uint64_t, uint64_t> record_of;
  for (uint64_t r = 0; r < limit; ++r) record_of[FeatureKey(0, r)] = r;
  std::vector<uint64_t> records;
  for (const Sample& s : Drain(reader, 128)) {
    EXPECT_EQ(s.slots[0].size(), 1u);
    if (s.slots[0].empty()) continue;
    auto it = record_of.find(s.slots[0][0]);
    EXPECT_NE(it, record_of.end());
    if (it != record_of.end()) records.push_back(it->second);
  }
  return records;
}

TEST(ReaderSplitTest, ShardsAndSplitsCoverEveryRecordOnceByTheRule) {
  TempDir dir;
  constexpr int kRecords = 10000;
  DataConfig config = FileConfig("libsvm", NumberedRecords(dir, kRecords));
  config.test_fraction = 0.1;
  config.split_seed = 5;

  std::vector<uint64_t> want_train;
  std::vector<uint64_t> want_test;
  for (uint64_t r = 0; r < kRecords; ++r) {
    (IsTestRecord(5, 0.1, r) ? want_test : want_train).push_back(r);
  }
  EXPECT_NEAR(static_cast<double>(want_test.size()) / kRecords, 0.1, 0.015);

  std::map<uint64_t, int> seen;
  constexpr uint32_t kShards = 3;
  for (uint32_t w = 0; w < kShards; ++w) {
    std::unique_ptr<Reader> reader =
        MustOpen(config, Split::kTrain, w, kShards);
    ASSERT_NE(reader, nullptr);
    const std::vector<uint64_t> got = RecordsOf(*reader);
    std::vector<uint64_t> want;
    for (size_t i = w; i < want_train.size(); i += kShards) {
      want.push_back(want_train[i]);
    }
    EXPECT_EQ(got, want) << "train shard " << w;
    EXPECT_EQ(reader->stats().records, kRecords);
    for (uint64_t r : got) ++seen[r];
  }
  std::unique_ptr<Reader> test = MustOpen(config, Split::kTest);
  ASSERT_NE(test, nullptr);
  const std::vector<uint64_t> test_records = RecordsOf(*test);
  EXPECT_EQ(test_records, want_test);
  for (uint64_t r : test_records) ++seen[r];

  ASSERT_EQ(seen.size(), static_cast<size_t>(kRecords));
  for (const auto& [r, count] : seen) ASSERT_EQ(count, 1) << "record " << r;

  // Sharding the test split follows the same rule.
  std::unique_ptr<Reader> test1 = MustOpen(config, Split::kTest, 1, 2);
  ASSERT_NE(test1, nullptr);
  std::vector<uint64_t> want_test1;
  for (size_t i = 1; i < want_test.size(); i += 2) {
    want_test1.push_back(want_test[i]);
  }
  EXPECT_EQ(RecordsOf(*test1), want_test1);
}

TEST(ReaderSplitTest, SameConfigSameAssignmentOtherSeedOtherTestSet) {
  TempDir dir;
  DataConfig config = FileConfig("libsvm", NumberedRecords(dir, 2000));
  config.test_fraction = 0.2;
  std::unique_ptr<Reader> a = MustOpen(config, Split::kTest);
  std::unique_ptr<Reader> b = MustOpen(config, Split::kTest);
  config.split_seed = 2;
  std::unique_ptr<Reader> c = MustOpen(config, Split::kTest);
  ASSERT_TRUE(a && b && c);
  const std::vector<uint64_t> ra = RecordsOf(*a);
  EXPECT_EQ(ra, RecordsOf(*b));
  EXPECT_NE(ra, RecordsOf(*c));
}

TEST(ReaderSplitTest, RewindReplaysTheSameSequence) {
  TempDir dir;
  DataConfig config = FileConfig("libsvm", NumberedRecords(dir, 500));
  config.test_fraction = 0.3;
  std::unique_ptr<Reader> reader = MustOpen(config, Split::kTrain, 1, 2);
  ASSERT_NE(reader, nullptr);
  const std::vector<Sample> first = Drain(*reader, 7);
  const ReaderStats stats = reader->stats();
  Batch batch;
  EXPECT_EQ(*reader->Next(7, &batch), 0u);  // stays at the end
  ASSERT_TRUE(reader->Rewind().ok());
  EXPECT_EQ(reader->stats().samples, 0u);  // stats cover one pass
  const std::vector<Sample> second = Drain(*reader, 7);
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, second);
  EXPECT_EQ(reader->stats().samples, stats.samples);
  EXPECT_EQ(reader->stats().records, 500u);
}

TEST(ReaderShuffleTest, BlocksArePermutedBySeedShardAndEpoch) {
  TempDir dir;
  DataConfig config = FileConfig("libsvm", NumberedRecords(dir, 500));
  config.test_fraction = 0.2;
  const std::vector<uint64_t> file_order = RecordsOf(*MustOpen(config));
  ASSERT_GT(file_order.size(), 300u);
  config.shuffle_buffer = 64;
  std::unique_ptr<Reader> reader = MustOpen(config);
  ASSERT_NE(reader, nullptr);
  const std::vector<uint64_t> first = RecordsOf(*reader);
  EXPECT_EQ(reader->stats().samples, file_order.size());
  ASSERT_TRUE(reader->Rewind().ok());
  const std::vector<uint64_t> second = RecordsOf(*reader);
  // Each block of 64 is a permutation of the same 64 records in file order:
  // nothing lost, nothing repeated, nothing moved across a block.
  for (const auto* order : {&first, &second}) {
    ASSERT_EQ(order->size(), file_order.size());
    EXPECT_NE(*order, file_order);
    for (size_t at = 0; at < file_order.size(); at += 64) {
      const size_t end = std::min(at + 64, file_order.size());
      std::vector<uint64_t> block(order->begin() + at, order->begin() + end);
      std::sort(block.begin(), block.end());
      EXPECT_EQ(block, std::vector<uint64_t>(file_order.begin() + at,
                                             file_order.begin() + end))
          << "block at " << at;
    }
  }
  EXPECT_NE(first, second) << "every epoch gets its own order";
  // The order is a function of the config: a second reader repeats it.
  EXPECT_EQ(RecordsOf(*MustOpen(config)), first);
  // The test split is never shuffled (evaluation does not care, and its
  // order stays comparable between runs).
  config.test_fraction = 0.5;
  const std::vector<uint64_t> test = RecordsOf(*MustOpen(config, Split::kTest));
  EXPECT_GT(test.size(), 100u);
  EXPECT_TRUE(std::is_sorted(test.begin(), test.end()));
}

TEST(ReaderSplitTest, SeekSplitsAShardIntoFinerOnes) {
  TempDir dir;
  DataConfig config = FileConfig("libsvm", NumberedRecords(dir, 400));
  config.test_fraction = 0.2;
  std::unique_ptr<Reader> reader = MustOpen(config, Split::kTrain, 1, 4);
  ASSERT_NE(reader, nullptr);
  const std::vector<uint64_t> whole = RecordsOf(*reader);
  std::vector<uint64_t> parts;
  for (uint32_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(reader->Seek(1 + 4 * k, 12, 0).ok());
    for (uint64_t r : RecordsOf(*reader)) parts.push_back(r);
  }
  std::sort(parts.begin(), parts.end());
  EXPECT_EQ(parts, whole);
  EXPECT_FALSE(whole.empty());
  EXPECT_THAT(reader->Seek(12, 12, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("12 of 12")));
}

TEST(ReaderShuffleTest, ABlockLargerThanTheShareShufflesItWhole) {
  TempDir dir;
  DataConfig config = FileConfig("libsvm", NumberedRecords(dir, 300));
  config.shuffle_buffer = 1000;
  std::vector<uint64_t> order = RecordsOf(*MustOpen(config, Split::kTrain, 1, 2));
  ASSERT_EQ(order.size(), 150u);
  // Records of the last third turn up in the first third of the order.
  EXPECT_GT(*std::max_element(order.begin(), order.begin() + 50), 200u);
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], 2 * i + 1);
}

// ----------------------------------------------------------------- errors

TEST(ReaderOpenTest, MissingFilesAreNotFound) {
  TempDir dir;
  const std::string missing = dir.path() + "/nope";
  for (const std::string format : {"criteo", "libsvm", "libfm", "movielens"}) {
    DataConfig config = FileConfig(format, missing);
    config.libfm_slots = 2;
    EXPECT_THAT(OpenReader(config, Split::kTrain, 0, 1),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)))
        << format;
  }
  // A MovieLens directory without ratings.csv, or without tags.csv when
  // tags are wanted.
  dir.Write("movies.csv", "movieId,title,genres\n");
  DataConfig ml = FileConfig("movielens", dir.path());
  EXPECT_THAT(OpenReader(ml, Split::kTrain, 0, 1),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ratings.csv")));
  dir.Write("ratings.csv", "userId,movieId,rating,timestamp\n");
  EXPECT_TRUE(OpenReader(ml, Split::kTrain, 0, 1).ok());
  ml.movielens_tags = true;
  EXPECT_THAT(OpenReader(ml, Split::kTrain, 0, 1),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tags.csv")));
}

TEST(ReaderOpenTest, BadSettingsAreInvalidArgument) {
  TempDir dir;
  const std::string path = dir.Write("x.svm", "1 1:1\n");
  DataConfig config = FileConfig("parquet", path);
  EXPECT_THAT(
      OpenReader(config, Split::kTrain, 0, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.format")));
  config.format = "libsvm";
  EXPECT_THAT(OpenReader(config, Split::kTrain, 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shard")));
  config.test_fraction = 1.5;
  EXPECT_THAT(OpenReader(config, Split::kTrain, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.test_fraction")));
  config = FileConfig("libsvm", dir.path());  // a directory
  EXPECT_THAT(
      OpenReader(config, Split::kTrain, 0, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("directory")));
  config = FileConfig("libsvm", "");
  EXPECT_THAT(
      OpenReader(config, Split::kTrain, 0, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.path")));
}

TEST(ReaderShapeTest, EveryFormat) {
  DataConfig c;
  auto shape = [&](const std::string& format) {
    c.format = format;
    absl::StatusOr<DataShape> s = ShapeOf(c);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::make_pair(s->num_slots, s->num_dense)
                  : std::make_pair(-1, -1);
  };
  c.fields = 5;
  EXPECT_EQ(shape("synthetic"), std::make_pair(5, 0));
  EXPECT_EQ(shape("movielens"), std::make_pair(3, 0));
  c.movielens_tags = true;
  EXPECT_EQ(shape("movielens"), std::make_pair(4, 0));
  EXPECT_EQ(shape("criteo"), std::make_pair(39, 13));
  EXPECT_EQ(shape("libsvm"), std::make_pair(1, 0));
  c.libfm_slots = 6;
  EXPECT_EQ(shape("libfm"), std::make_pair(6, 0));

  c.libfm_slots = 0;
  EXPECT_THAT(ShapeOf(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("data.libfm_slots")));
  c.format = "csv";
  EXPECT_THAT(ShapeOf(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("csv")));
}

// -------------------------------------------------------------- movielens

TEST(ReaderMovieLensTest, JoinsGenresAndTags) {
  TempDir dir;
  dir.Write("movies.csv",
            "movieId,title,genres\n"
            "1,Toy Story (1995),Adventure|Animation\n"
            "2,\"American President, The (1995)\",Comedy|Drama|Romance\n"
            "3,\"A \"\"quoted\"\" title\",(no genres listed)\n");
  dir.Write("tags.csv",
            "userId,movieId,tag,timestamp\n"
            "2,1,Pixar,1445714994\n"
            "7,1, pixar ,1445714995\n"
            "7,1,\"fun, for kids\",1445714996\n"
            "9,2,politics,1445714997\n");
  dir.Write("ratings.csv",
            "userId,movieId,rating,timestamp\n"
            "10,1,4.0,964982703\n"
            "11,2,3.5,964982704\n"
            "12,3,5,964982705\n"
            "13,4,0.5,964982706\n"
            "14,x,4.0,964982707\n"
            "15,1,4.0\n");

  DataConfig config = FileConfig("movielens", dir.path());
  config.movielens_tags = true;
  std::unique_ptr<Reader> reader = MustOpen(config);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->num_slots(), 4);
  const std::vector<Sample> s = Drain(*reader);
  ASSERT_EQ(s.size(), 4u);
  const uint64_t adventure = Hashed(2, "Adventure");
  const uint64_t animation = Hashed(2, "Animation");
  EXPECT_EQ(s[0], (Sample{1,
                          {{FeatureKey(0, 10)},
                           {FeatureKey(1, 1)},
                           {adventure, animation},
                           {Hashed(3, "pixar"), Hashed(3, "fun, for kids")}},
                          {}}));
  EXPECT_EQ(
      s[1],
      (Sample{0,
              {{FeatureKey(0, 11)},
               {FeatureKey(1, 2)},
               {Hashed(2, "Comedy"), Hashed(2, "Drama"), Hashed(2, "Romance")},
               {Hashed(3, "politics")}},
              {}}));
  // No genres listed; no tags.
  EXPECT_EQ(s[2],
            (Sample{1, {{FeatureKey(0, 12)}, {FeatureKey(1, 3)}, {}, {}}, {}}));
  // A movie missing from movies.csv.
  EXPECT_EQ(s[3],
            (Sample{0, {{FeatureKey(0, 13)}, {FeatureKey(1, 4)}, {}, {}}, {}}));
  // Line numbers count the header.
  EXPECT_EQ(reader->stats().records, 6u);
  EXPECT_THAT(reader->stats().examples,
              ElementsAre(AllOf(StartsWith(dir.path() + "/ratings.csv:6: "),
                                HasSubstr("movieId")),
                          StartsWith(dir.path() + "/ratings.csv:7: ")));

  // Without tags: three slots, the same first three.
  config.movielens_tags = false;
  reader = MustOpen(config);
  ASSERT_NE(reader, nullptr);
  const std::vector<Sample> no_tags = Drain(*reader);
  ASSERT_EQ(no_tags.size(), 4u);
  EXPECT_EQ(
      no_tags[0].slots,
      (std::vector<std::vector<uint64_t>>{
          {FeatureKey(0, 10)}, {FeatureKey(1, 1)}, {adventure, animation}}));
}

TEST(ReaderMovieLensTest, WrongHeaderIsInvalidArgument) {
  TempDir dir;
  dir.Write("movies.csv", "movieId,title,genres\n");
  dir.Write("ratings.csv", "1,1,4.0,964982703\n");
  EXPECT_THAT(
      OpenReader(FileConfig("movielens", dir.path()), Split::kTrain, 0, 1),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("ratings.csv:1"),
                     HasSubstr("userId,movieId,rating,timestamp"))));
  dir.Write("movies.csv", "movieId,title,genres\n1,\"Broken,Adventure\n");
  dir.Write("ratings.csv", "userId,movieId,rating,timestamp\n");
  EXPECT_THAT(
      OpenReader(FileConfig("movielens", dir.path()), Split::kTrain, 0, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("movies.csv:2")));
}

TEST(ReaderMovieLensTest, RealSmallDataSet) {
  DataConfig config =
      FileConfig("movielens", HETPS_SOURCE_DIR "/data/movielens-small");
  config.test_fraction = 0.1;
  config.movielens_tags = true;
  std::set<uint64_t> users;
  std::set<uint64_t> movies;
  uint64_t total = 0;
  uint64_t positives = 0;
  uint64_t test = 0;
  uint64_t with_tags = 0;
  for (Split split : {Split::kTrain, Split::kTest}) {
    std::unique_ptr<Reader> reader = MustOpen(config, split);
    ASSERT_NE(reader, nullptr);
    Batch batch;
    for (;;) {
      absl::StatusOr<size_t> n = reader->Next(4096, &batch);
      ASSERT_TRUE(n.ok()) << n.status();
      if (*n == 0) break;
      for (size_t i = 0; i < *n; ++i) {
        ASSERT_EQ(batch.SlotKeys(i, 0).size(), 1u);
        ASSERT_EQ(batch.SlotKeys(i, 1).size(), 1u);
        users.insert(batch.SlotKeys(i, 0)[0]);
        movies.insert(batch.SlotKeys(i, 1)[0]);
        positives += batch.labels[i] > 0.5f;
        with_tags += !batch.SlotKeys(i, 3).empty();
      }
      total += *n;
      if (split == Split::kTest) test += *n;
    }
    EXPECT_EQ(reader->stats().malformed, 0u);
    EXPECT_EQ(reader->stats().records, 100836u);
  }
  EXPECT_EQ(total, 100836u);
  EXPECT_EQ(users.size(), 610u);
  EXPECT_EQ(movies.size(), 9724u);
  EXPECT_EQ(positives, 48580u);  // ratings >= 4
  EXPECT_NEAR(static_cast<double>(test) / total, 0.1, 0.01);
  EXPECT_GT(with_tags, 0u);
}

// -------------------------------------------------------------- synthetic

TEST(ReaderSyntheticTest, ShardsTheTeachersSamplesByIndex) {
  DataConfig config;
  config.format = "synthetic";
  config.train_samples = 100;
  config.test_samples = 10;
  config.fields = 4;
  const SyntheticLrData data(config);
  std::vector<uint64_t> keys(4);

  std::unique_ptr<Reader> train = MustOpen(config, Split::kTrain, 1, 3);
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->num_slots(), 4);
  std::vector<Sample> got = Drain(*train, 8);
  ASSERT_EQ(got.size(), 33u);  // 1, 4, ..., 97
  for (size_t i = 0; i < got.size(); ++i) {
    const float label = data.TrainSample(1 + 3 * i, keys);
    Sample want{label, {}, {}};
    for (uint64_t k : keys) want.slots.push_back({k});
    ASSERT_EQ(got[i], want) << i;
  }
  ASSERT_TRUE(train->Rewind().ok());
  EXPECT_EQ(Drain(*train, 100), got);

  std::unique_ptr<Reader> test = MustOpen(config, Split::kTest);
  ASSERT_NE(test, nullptr);
  got = Drain(*test);
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    const float label = data.TestSample(i, keys);
    Sample want{label, {}, {}};
    for (uint64_t k : keys) want.slots.push_back({k});
    ASSERT_EQ(got[i], want) << i;
  }
}

}  // namespace
}  // namespace hetps
