// Private to data/: the pieces shared by the line-oriented readers (criteo,
// libsvm, libfm, movielens). reader.cc owns the streaming, the split/shard
// rule and the malformed-record policy of data/reader.h; each format only
// says how one line becomes one sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/reader.h"
#include "hetps/config.h"

namespace hetps {

// Turns one line of a text format into one sample. Used by one reader on one
// thread.
class LineParser {
 public:
  virtual ~LineParser() = default;

  virtual int num_slots() const = 0;
  virtual int num_dense() const = 0;

  // Lines before the first record (a CSV header). They are not records and
  // are handed to CheckHeader, which fails with INVALID_ARGUMENT when the
  // file is evidently not in this format.
  virtual int header_lines() const { return 0; }
  virtual absl::Status CheckHeader(std::string_view line) const {
    (void)line;
    return absl::OkStatus();
  }

  // Appends the sample of `line` (no line terminator) to `batch`: BeginSample,
  // num_slots() slots, num_dense() dense values. On a malformed line returns
  // an error whose message is the reason ("expected 40 fields, got 12"); it
  // may have appended part of a sample, which the caller drops.
  virtual absl::Status Parse(std::string_view line, Batch* batch) = 0;
};

// A Reader over the lines of the file at `path`, parsed by `parser`, as
// described in data/reader.h. NOT_FOUND when the file does not exist;
// INVALID_ARGUMENT for bad split settings or a header CheckHeader rejects.
absl::StatusOr<std::unique_ptr<Reader>> OpenLineReader(
    const DataConfig& config, const std::string& path,
    std::unique_ptr<LineParser> parser, Split split, uint32_t shard,
    uint32_t num_shards);

// Parsers of each text format (one .cc file each).
std::unique_ptr<LineParser> MakeCriteoParser();
std::unique_ptr<LineParser> MakeLibsvmParser();
// Slots 0..slots-1; a feature naming another slot makes the line malformed.
std::unique_ptr<LineParser> MakeLibfmParser(int slots);
// Loads movies.csv and tags.csv (and the movielens_tags setting) from
// config.path at once; NOT_FOUND when a file is missing, INVALID_ARGUMENT
// naming file and line when one of them is malformed. The parser reads
// ratings.csv lines.
absl::StatusOr<std::unique_ptr<LineParser>> MakeMovieLensParser(
    const DataConfig& config);

// Helpers for the parsers. Each accepts exactly the whole of `text`.
bool ParseUint64(std::string_view text, uint64_t* value);
bool ParseInt64(std::string_view text, int64_t* value);
bool ParseDouble(std::string_view text, double* value);  // finite only
// CTR labels: 0 and 1; -1 and +1 (libsvm's binary classes) map to 0 and 1.
bool ParseBinaryLabel(std::string_view text, float* label);

}  // namespace hetps
