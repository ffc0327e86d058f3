#include "data/reader.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"
#include "data/synthetic.h"
#include "data/text_reader.h"

namespace hetps {
namespace {

// Slots live in the top 16 bits of a feature key (data/feature_key.h).
constexpr int kMaxSlots = 1 << 16;
constexpr size_t kMaxExamples = 10;
// The bad fraction is only judged once this many records were parsed, so a
// couple of bad lines at the top of a file do not stop a job.
constexpr uint64_t kMinRecordsForBadFraction = 100;
constexpr size_t kInitialBuffer = 1 << 20;
// A "line" longer than this is not text in any format we read (a binary file
// would otherwise be buffered whole while looking for a newline).
constexpr size_t kMaxLineBytes = size_t{64} << 20;

absl::Status CheckShard(uint32_t shard, uint32_t num_shards) {
  if (num_shards == 0 || shard >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reader shard ", shard, " of ", num_shards, ": need shard < shards"));
  }
  return absl::OkStatus();
}

absl::Status CheckSplitSettings(const DataConfig& config, uint32_t shard,
                                uint32_t num_shards) {
  if (!(config.test_fraction >= 0 && config.test_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.test_fraction: must be in [0, 1], got ", config.test_fraction));
  }
  if (!(config.max_bad_fraction >= 0 && config.max_bad_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.max_bad_fraction: must be in [0, 1], got ",
                     config.max_bad_fraction));
  }
  return CheckShard(shard, num_shards);
}

// The split rule of data/reader.h: a pure function of (seed, record number).
bool InTestSplit(uint64_t split_seed, double test_fraction, uint64_t record) {
  const uint64_t h = Mix64(split_seed ^ Mix64(record));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < test_fraction;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Lines of a file, read in large blocks: the file is never held whole, and a
// line is a view into the block buffer.
class LineSource {
 public:
  absl::Status Open(const std::string& path) {
    path_ = path;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      const int err = errno;
      return absl::ErrnoToStatus(err,
                                 absl::StrCat("data.path: cannot open ", path));
    }
    file_.reset(f);
    buffer_.resize(kInitialBuffer);
    return absl::OkStatus();
  }

  absl::Status Rewind() {
    if (std::fseek(file_.get(), 0, SEEK_SET) != 0) {
      const int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat("rewinding ", path_));
    }
    std::clearerr(file_.get());
    begin_ = end_ = 0;
    eof_ = false;
    return absl::OkStatus();
  }

  // Sets `line` to the next line without its "\n" or "\r\n"; `terminated`
  // says whether it ended with a newline (false only for the last line of a
  // file cut short). Returns false at the end of the file. `line` stays
  // valid until the next call.
  absl::StatusOr<bool> Next(std::string_view* line, bool* terminated) {
    size_t scanned = begin_;
    for (;;) {
      const void* nl =
          std::memchr(buffer_.data() + scanned, '\n', end_ - scanned);
      if (nl != nullptr) {
        const size_t at = static_cast<const char*>(nl) - buffer_.data();
        *line = Trim(begin_, at);
        *terminated = true;
        begin_ = at + 1;
        return true;
      }
      if (eof_) {
        if (begin_ == end_) return false;
        *line = Trim(begin_, end_);
        *terminated = false;
        begin_ = end_;
        return true;
      }
      // Keep the partial line, then read more behind it.
      const size_t partial = end_ - begin_;
      std::memmove(buffer_.data(), buffer_.data() + begin_, partial);
      begin_ = 0;
      end_ = partial;
      scanned = partial;
      if (end_ == buffer_.size()) {
        if (buffer_.size() >= kMaxLineBytes) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": a line longer than ", kMaxLineBytes,
                           " bytes; is this a text file?"));
        }
        buffer_.resize(buffer_.size() * 2);
      }
      const size_t n = std::fread(buffer_.data() + end_, 1,
                                  buffer_.size() - end_, file_.get());
      end_ += n;
      if (n == 0) {
        if (std::ferror(file_.get())) {
          const int err = errno;
          return absl::ErrnoToStatus(err, absl::StrCat("reading ", path_));
        }
        eof_ = true;
      }
    }
  }

 private:
  std::string_view Trim(size_t from, size_t to) const {
    if (to > from && buffer_[to - 1] == '\r') --to;
    return std::string_view(buffer_.data() + from, to - from);
  }

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // first unread byte
  size_t end_ = 0;    // end of the bytes read into buffer_
  bool eof_ = false;
};

// The Reader of every text format. Only the records of this reader's share
// are parsed (the split and shard of a record depend on its number alone),
// so W workers do not each parse the whole file; malformed records and the
// bad fraction are therefore counted over this share. stats() describe the
// current pass and start again at Rewind, as the bad-fraction check does.
class LineReader final : public Reader {
 public:
  LineReader(const DataConfig& config, std::string path,
             std::unique_ptr<LineParser> parser, Split split, uint32_t shard,
             uint32_t num_shards)
      : path_(std::move(path)),
        format_(config.format),
        parser_(std::move(parser)),
        split_(split),
        shard_(shard),
        num_shards_(num_shards),
        test_fraction_(config.test_fraction),
        split_seed_(config.split_seed),
        max_bad_fraction_(config.max_bad_fraction) {}

  absl::Status Open() {
    if (absl::Status s = source_.Open(path_); !s.ok()) return s;
    return SkipHeader();
  }

  int num_slots() const override { return parser_->num_slots(); }
  int num_dense() const override { return parser_->num_dense(); }
  const ReaderStats& stats() const override { return stats_; }

  absl::StatusOr<size_t> Next(size_t max_samples, Batch* batch) override {
    batch->Clear();
    batch->num_slots = parser_->num_slots();
    batch->num_dense = parser_->num_dense();
    // A stopped pass stays stopped until Rewind: the caller sees the same
    // error however often it asks.
    if (!error_.ok()) return error_;
    while (batch->size() < max_samples) {
      std::string_view line;
      bool terminated = true;
      absl::StatusOr<bool> more = source_.Next(&line, &terminated);
      if (!more.ok()) return error_ = more.status();
      if (!*more) {
        if (absl::Status s = FinishPass(); !s.ok()) return error_ = s;
        break;
      }
      ++line_number_;
      const uint64_t record = stats_.records++;
      if (!Mine(record)) continue;
      ++parsed_;
      if (absl::Status s = ParseInto(line, terminated, batch); !s.ok()) {
        return error_ = s;
      }
    }
    return batch->size();
  }

  absl::Status Rewind() override {
    if (absl::Status s = source_.Rewind(); !s.ok()) return s;
    return SkipHeader();
  }

  absl::Status Seek(uint32_t shard, uint32_t num_shards, uint32_t) override {
    if (absl::Status s = CheckShard(shard, num_shards); !s.ok()) return s;
    shard_ = shard;
    num_shards_ = num_shards;
    return Rewind();
  }

 private:
  absl::Status SkipHeader() {
    stats_ = ReaderStats();
    error_ = absl::OkStatus();
    line_number_ = 0;
    split_records_ = 0;
    parsed_ = 0;
    first_bad_line_ = 0;
    first_bad_reason_.clear();
    pass_done_ = false;
    for (int i = 0; i < parser_->header_lines(); ++i) {
      std::string_view line;
      bool terminated = true;
      absl::StatusOr<bool> more = source_.Next(&line, &terminated);
      if (!more.ok()) return more.status();
      if (!*more) break;  // empty file: no records
      ++line_number_;
      if (absl::Status s = parser_->CheckHeader(line); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path_, ":", line_number_, ": ", s.message(),
            "; is the file really in the '", format_, "' format?"));
      }
    }
    return absl::OkStatus();
  }

  // Whether `record` belongs to this reader's split and shard.
  bool Mine(uint64_t record) {
    const bool test = InTestSplit(split_seed_, test_fraction_, record);
    if (test != (split_ == Split::kTest)) return false;
    return split_records_++ % num_shards_ == shard_;
  }

  // Parses one record of this share; a malformed one is dropped and counted.
  // Fails only when the bad fraction is exceeded.
  absl::Status ParseInto(std::string_view line, bool terminated, Batch* batch) {
    const size_t labels = batch->labels.size();
    const size_t dense = batch->dense.size();
    const size_t offsets = batch->offsets.size();
    const size_t keys = batch->keys.size();
    absl::Status parsed = line.empty()
                              ? absl::InvalidArgumentError("empty line")
                              : parser_->Parse(line, batch);
    if (parsed.ok()) {
      ++stats_.samples;
    } else {
      batch->labels.resize(labels);
      batch->dense.resize(dense);
      batch->offsets.resize(offsets);
      batch->keys.resize(keys);
      // A cut-off last line fails for whatever field it lost; the cause
      // worth reporting is the cut.
      NoteMalformed(terminated ? std::string(parsed.message())
                               : std::string("truncated record"));
    }
    if (parsed_ >= kMinRecordsForBadFraction &&
        static_cast<double>(stats_.malformed) >
            max_bad_fraction_ * static_cast<double>(parsed_)) {
      return TooManyBad();
    }
    return absl::OkStatus();
  }

  void NoteMalformed(std::string reason) {
    ++stats_.malformed;
    if (first_bad_line_ == 0) {
      first_bad_line_ = line_number_;
      first_bad_reason_ = reason;
    }
    if (stats_.examples.size() < kMaxExamples) {
      stats_.examples.push_back(
          absl::StrCat(path_, ":", line_number_, ": ", reason));
    }
  }

  absl::Status TooManyBad() const {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path: ", path_, ": ", stats_.malformed, " of ", parsed_,
        " records malformed (more than data.max_bad_fraction = ",
        max_bad_fraction_, "), the first at line ", first_bad_line_, ": ",
        first_bad_reason_, "; is the file really in the '", format_,
        "' format?"));
  }

  absl::Status FinishPass() {
    if (pass_done_) return absl::OkStatus();
    pass_done_ = true;
    // Too short a share for the fraction rule, but nothing usable in it at
    // all: the same verdict.
    if (parsed_ > 0 && stats_.malformed == parsed_ &&
        static_cast<double>(stats_.malformed) >
            max_bad_fraction_ * static_cast<double>(parsed_)) {
      return TooManyBad();
    }
    if (stats_.malformed > 0) {
      spdlog::warn("{}: skipped {} malformed of {} records read, e.g. {}",
                   path_, stats_.malformed, parsed_, stats_.examples.front());
    }
    return absl::OkStatus();
  }

  // Constant after construction.
  const std::string path_;
  const std::string format_;
  const std::unique_ptr<LineParser> parser_;
  const Split split_;
  uint32_t shard_;
  uint32_t num_shards_;
  const double test_fraction_;
  const uint64_t split_seed_;
  const double max_bad_fraction_;

  // State of the current pass (reset by Rewind).
  LineSource source_;
  ReaderStats stats_;
  absl::Status error_;
  uint64_t line_number_ = 0;    // 1-based number of the last line read
  uint64_t split_records_ = 0;  // records of split_ seen so far
  uint64_t parsed_ = 0;         // records of this share handed to parser_
  uint64_t first_bad_line_ = 0;
  std::string first_bad_reason_;
  bool pass_done_ = false;
};

// The `synthetic` format: SyntheticLrData's samples, sharded by index. The
// teacher already keeps its train and test samples apart, so test_fraction
// and split_seed play no part.
class SyntheticReader final : public Reader {
 public:
  SyntheticReader(const DataConfig& config, Split split, uint32_t shard,
                  uint32_t num_shards)
      : data_(config),
        split_(split),
        shard_(shard),
        num_shards_(num_shards),
        size_(split == Split::kTrain ? data_.train_size() : data_.test_size()),
        keys_(static_cast<size_t>(config.fields)),
        next_(shard) {}

  int num_slots() const override { return data_.fields(); }
  int num_dense() const override { return 0; }
  const ReaderStats& stats() const override { return stats_; }

  absl::StatusOr<size_t> Next(size_t max_samples, Batch* batch) override {
    batch->Clear();
    batch->num_slots = data_.fields();
    batch->num_dense = 0;
    while (batch->size() < max_samples && next_ < size_) {
      const float label = split_ == Split::kTrain
                              ? data_.TrainSample(next_, keys_)
                              : data_.TestSample(next_, keys_);
      batch->BeginSample(label);
      for (uint64_t key : keys_) {
        batch->AddKey(key);
        batch->EndSlot();
      }
      ++stats_.records;
      ++stats_.samples;
      // Stop rather than wrap when the index space is nearly exhausted.
      if (size_ - next_ <= num_shards_) {
        next_ = size_;
      } else {
        next_ += num_shards_;
      }
    }
    return batch->size();
  }

  absl::Status Rewind() override {
    next_ = shard_;
    stats_ = ReaderStats();
    return absl::OkStatus();
  }

  absl::Status Seek(uint32_t shard, uint32_t num_shards, uint32_t) override {
    if (absl::Status s = CheckShard(shard, num_shards); !s.ok()) return s;
    shard_ = shard;
    num_shards_ = num_shards;
    return Rewind();
  }

 private:
  const SyntheticLrData data_;
  const Split split_;
  uint32_t shard_;
  uint32_t num_shards_;
  const uint64_t size_;
  std::vector<uint64_t> keys_;  // scratch for one sample
  uint64_t next_;               // index of the next sample of this shard
  ReaderStats stats_;
};

// Hands out the train samples of `inner` in a seeded random order: reads a
// block of `block` samples, emits them permuted, reads the next. A share
// that fits in one block is fully shuffled; a larger one is shuffled within
// blocks. The order depends on (seed, shard, shards, epoch) only.
class ShuffleReader final : public Reader {
 public:
  ShuffleReader(std::unique_ptr<Reader> inner, uint64_t block, uint64_t seed,
                uint32_t shard, uint32_t num_shards)
      : inner_(std::move(inner)),
        block_(block),
        seed_(seed),
        shard_(shard),
        num_shards_(num_shards) {}

  int num_slots() const override { return inner_->num_slots(); }
  int num_dense() const override { return inner_->num_dense(); }
  const ReaderStats& stats() const override { return inner_->stats(); }

  absl::StatusOr<size_t> Next(size_t max_samples, Batch* batch) override {
    batch->Clear();
    batch->num_slots = inner_->num_slots();
    batch->num_dense = inner_->num_dense();
    while (batch->size() < max_samples) {
      if (next_ == order_.size()) {
        absl::StatusOr<size_t> n = inner_->Next(block_, &pool_);
        if (!n.ok()) return n.status();
        if (*n == 0) break;
        order_.resize(*n);
        std::iota(order_.begin(), order_.end(), uint32_t{0});
        std::mt19937_64 rng(
            Mix64(seed_ ^ Mix64((uint64_t{epoch_} << 32) ^ shard_) ^
                  Mix64((uint64_t{num_shards_} << 32) ^ blocks_++)));
        std::shuffle(order_.begin(), order_.end(), rng);
        next_ = 0;
      }
      batch->AppendSample(pool_, order_[next_++]);
    }
    return batch->size();
  }

  absl::Status Rewind() override {
    return Seek(shard_, num_shards_, epoch_ + 1);
  }

  absl::Status Seek(uint32_t shard, uint32_t num_shards,
                    uint32_t pass) override {
    order_.clear();
    next_ = 0;
    blocks_ = 0;
    shard_ = shard;
    num_shards_ = num_shards;
    epoch_ = pass;
    return inner_->Seek(shard, num_shards, pass);
  }

 private:
  const std::unique_ptr<Reader> inner_;
  const uint64_t block_;
  const uint64_t seed_;
  uint32_t shard_;
  uint32_t num_shards_;
  Batch pool_;                   // the current block
  std::vector<uint32_t> order_;  // its permutation
  size_t next_ = 0;              // next position in order_
  uint64_t blocks_ = 0;          // blocks read this epoch
  uint32_t epoch_ = 0;
};

absl::StatusOr<std::unique_ptr<Reader>> OpenUnshuffled(const DataConfig& config,
                                                       Split split,
                                                       uint32_t shard,
                                                       uint32_t num_shards);

}  // namespace

bool ParseUint64(std::string_view text, uint64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool ParseInt64(std::string_view text, int64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool ParseDouble(std::string_view text, double* value) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty() &&
         std::isfinite(*value);
}

bool ParseBinaryLabel(std::string_view text, float* label) {
  double v = 0;
  if (!ParseDouble(text, &v)) return false;
  if (v == 1) {
    *label = 1;
  } else if (v == 0 || v == -1) {
    *label = 0;
  } else {
    return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<Reader>> OpenLineReader(
    const DataConfig& config, const std::string& path,
    std::unique_ptr<LineParser> parser, Split split, uint32_t shard,
    uint32_t num_shards) {
  if (absl::Status s = CheckSplitSettings(config, shard, num_shards); !s.ok()) {
    return s;
  }
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat("data.path: no such file: ", path));
  }
  if (std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: ", path, " is a directory; the '",
                     config.format, "' format reads one file"));
  }
  auto reader = std::make_unique<LineReader>(config, path, std::move(parser),
                                             split, shard, num_shards);
  if (absl::Status s = reader->Open(); !s.ok()) return s;
  return reader;
}

absl::StatusOr<DataShape> ShapeOf(const DataConfig& config) {
  const std::string& f = config.format;
  if (f == "synthetic") {
    if (config.fields < 1 || config.fields > kMaxSlots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.fields: must be in [1, ", kMaxSlots, "], got ", config.fields));
    }
    return DataShape{.num_slots = config.fields, .num_dense = 0};
  }
  if (f == "movielens") {
    return DataShape{.num_slots = config.movielens_tags ? 4 : 3,
                     .num_dense = 0};
  }
  if (f == "criteo") return DataShape{.num_slots = 39, .num_dense = 13};
  if (f == "libsvm") return DataShape{.num_slots = 1, .num_dense = 0};
  if (f == "libfm") {
    if (config.libfm_slots < 1 || config.libfm_slots > kMaxSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.libfm_slots: must be in [1, ", kMaxSlots,
                       "] for the libfm format, got ", config.libfm_slots));
    }
    return DataShape{.num_slots = config.libfm_slots, .num_dense = 0};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("data.format: unknown format '", f,
                   "' (synthetic | movielens | criteo | libsvm | libfm)"));
}

absl::StatusOr<std::unique_ptr<Reader>> OpenReader(const DataConfig& config,
                                                   Split split, uint32_t shard,
                                                   uint32_t num_shards) {
  absl::StatusOr<std::unique_ptr<Reader>> reader =
      OpenUnshuffled(config, split, shard, num_shards);
  // Synthetic samples are independent draws already: nothing to shuffle.
  if (!reader.ok() || split != Split::kTrain || config.shuffle_buffer == 0 ||
      config.format == "synthetic") {
    return reader;
  }
  if (config.shuffle_buffer > (uint64_t{1} << 32) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.shuffle_buffer: at most 2^32-1 samples, got ",
                     config.shuffle_buffer));
  }
  return std::make_unique<ShuffleReader>(*std::move(reader),
                                         config.shuffle_buffer,
                                         config.split_seed, shard, num_shards);
}

namespace {

absl::StatusOr<std::unique_ptr<Reader>> OpenUnshuffled(const DataConfig& config,
                                                       Split split,
                                                       uint32_t shard,
                                                       uint32_t num_shards) {
  // Also rejects unknown formats and bad slot counts.
  if (absl::StatusOr<DataShape> shape = ShapeOf(config); !shape.ok()) {
    return shape.status();
  }
  if (absl::Status s = CheckSplitSettings(config, shard, num_shards); !s.ok()) {
    return s;
  }
  const std::string& f = config.format;
  if (f == "synthetic") {
    return std::make_unique<SyntheticReader>(config, split, shard, num_shards);
  }
  if (config.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: must name the data for the '", f, "' format"));
  }
  if (f == "movielens") {
    absl::StatusOr<std::unique_ptr<LineParser>> parser =
        MakeMovieLensParser(config);
    if (!parser.ok()) return parser.status();
    return OpenLineReader(
        config, (std::filesystem::path(config.path) / "ratings.csv").string(),
        std::move(*parser), split, shard, num_shards);
  }
  std::unique_ptr<LineParser> parser;
  if (f == "criteo") {
    parser = MakeCriteoParser();
  } else if (f == "libsvm") {
    parser = MakeLibsvmParser();
  } else {
    parser = MakeLibfmParser(config.libfm_slots);
  }
  return OpenLineReader(config, config.path, std::move(parser), split, shard,
                        num_shards);
}

}  // namespace

}  // namespace hetps
