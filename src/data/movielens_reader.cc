// MovieLens (the ml-latest CSV layout): ratings.csv lines → samples, with the
// movie's genres (movies.csv) and, when data.movielens_tags is set, every tag
// any user gave the movie (tags.csv). The two side files are small and are
// loaded whole at open; ratings.csv is streamed by the line reader.
//
// Sample: label = rating >= 4; slot 0 the user, slot 1 the movie, slot 2 the
// genres, slot 3 the tags (lowercased, trimmed, each once, in order of first
// appearance in tags.csv). A movie missing from movies.csv has no genres.
#include <xxhash.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/feature_key.h"
#include "data/text_reader.h"

namespace hetps {
namespace {

constexpr uint32_t kUserSlot = 0;
constexpr uint32_t kMovieSlot = 1;
constexpr uint32_t kGenreSlot = 2;
constexpr uint32_t kTagSlot = 3;
constexpr double kPositiveRating = 4.0;

uint64_t StringKey(uint32_t slot, std::string_view s) {
  return FeatureKey(slot, XXH3_64bits(s.data(), s.size()));
}

// Splits one CSV line (RFC 4180 quoting: a quoted field may hold commas and
// doubled quotes; no line breaks inside fields, which MovieLens never has)
// into `fields`, reusing its strings. False on a broken quote.
bool SplitCsv(std::string_view line, std::vector<std::string>* fields) {
  size_t count = 0;
  size_t i = 0;
  for (;;) {
    if (fields->size() <= count) fields->emplace_back();
    std::string& field = (*fields)[count++];
    field.clear();
    if (i < line.size() && line[i] == '"') {
      ++i;
      for (;;) {
        if (i >= line.size()) return false;  // unterminated quote
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            field.push_back('"');
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        field.push_back(line[i++]);
      }
      if (i < line.size() && line[i] != ',') return false;  // text after "
    } else {
      const size_t comma = line.find(',', i);
      const size_t end = comma == std::string_view::npos ? line.size() : comma;
      field.assign(line.substr(i, end - i));
      i = end;
    }
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  fields->resize(count);
  return true;
}

absl::Status CheckCsvHeader(std::string_view line,
                            const std::vector<std::string>& expected) {
  std::vector<std::string> fields;
  if (!SplitCsv(line, &fields) || fields != expected) {
    std::string want;
    for (const std::string& f : expected) {
      absl::StrAppend(&want, want.empty() ? "" : ",", f);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("expected the header '", want, "'"));
  }
  return absl::OkStatus();
}

struct MovieFeatures {
  std::vector<uint64_t> genres;
  std::vector<uint64_t> tags;
};

using MovieMap = absl::flat_hash_map<uint64_t, MovieFeatures>;

// Calls `fn(fields)` for each data line of the small CSV file at `path`
// after checking its header; any error names file and line.
template <typename Fn>
absl::Status ForEachCsvRow(const std::string& path,
                           const std::vector<std::string>& header, Fn fn) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("data.path: no such file: ", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path));
  }
  std::string line;
  std::vector<std::string> fields;
  uint64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    absl::Status s;
    if (number == 1) {
      s = CheckCsvHeader(line, header);
    } else if (!SplitCsv(line, &fields)) {
      s = absl::InvalidArgumentError("unbalanced quotes");
    } else if (fields.size() != header.size()) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "expected ", header.size(), " fields, got ", fields.size()));
    } else {
      s = fn(fields);
    }
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": ", s.message()));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", path));
  return absl::OkStatus();
}

absl::Status LoadMovies(const std::string& path, MovieMap* movies) {
  return ForEachCsvRow(path, {"movieId", "title", "genres"},
                       [&](const std::vector<std::string>& f) -> absl::Status {
                         uint64_t id = 0;
                         if (!ParseUint64(f[0], &id)) {
                           return absl::InvalidArgumentError(absl::StrCat(
                               "movieId '", f[0], "' is not a number"));
                         }
                         std::vector<uint64_t>& genres = (*movies)[id].genres;
                         genres.clear();
                         if (f[2] == "(no genres listed)")
                           return absl::OkStatus();
                         std::string_view rest = f[2];
                         while (!rest.empty()) {
                           const size_t bar = rest.find('|');
                           const std::string_view genre = rest.substr(0, bar);
                           if (!genre.empty())
                             genres.push_back(StringKey(kGenreSlot, genre));
                           if (bar == std::string_view::npos) break;
                           rest.remove_prefix(bar + 1);
                         }
                         return absl::OkStatus();
                       });
}

// Tags are free text typed by users: case and surrounding blanks carry no
// meaning, so "Dark Comedy" and "dark comedy " are one feature.
std::string NormaliseTag(std::string_view tag) {
  size_t b = 0;
  size_t e = tag.size();
  while (b < e && std::isspace(static_cast<unsigned char>(tag[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(tag[e - 1]))) --e;
  std::string out(tag.substr(b, e - b));
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

absl::Status LoadTags(const std::string& path, MovieMap* movies) {
  return ForEachCsvRow(path, {"userId", "movieId", "tag", "timestamp"},
                       [&](const std::vector<std::string>& f) -> absl::Status {
                         uint64_t id = 0;
                         if (!ParseUint64(f[1], &id)) {
                           return absl::InvalidArgumentError(absl::StrCat(
                               "movieId '", f[1], "' is not a number"));
                         }
                         const std::string tag = NormaliseTag(f[2]);
                         if (tag.empty()) return absl::OkStatus();
                         const uint64_t key = StringKey(kTagSlot, tag);
                         std::vector<uint64_t>& tags = (*movies)[id].tags;
                         // Few tags per movie: a scan beats a set.
                         for (uint64_t k : tags) {
                           if (k == key) return absl::OkStatus();
                         }
                         tags.push_back(key);
                         return absl::OkStatus();
                       });
}

class MovieLensParser final : public LineParser {
 public:
  MovieLensParser(MovieMap movies, bool tags)
      : movies_(std::move(movies)), tags_(tags) {}

  int num_slots() const override { return tags_ ? 4 : 3; }
  int num_dense() const override { return 0; }
  int header_lines() const override { return 1; }

  absl::Status CheckHeader(std::string_view line) const override {
    return CheckCsvHeader(line, {"userId", "movieId", "rating", "timestamp"});
  }

  absl::Status Parse(std::string_view line, Batch* batch) override {
    if (!SplitCsv(line, &fields_)) {
      return absl::InvalidArgumentError("unbalanced quotes");
    }
    if (fields_.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected 4 fields, got ", fields_.size()));
    }
    uint64_t user = 0;
    uint64_t movie = 0;
    double rating = 0;
    int64_t timestamp = 0;
    if (!ParseUint64(fields_[0], &user)) {
      return absl::InvalidArgumentError(
          absl::StrCat("userId '", fields_[0], "' is not a number"));
    }
    if (!ParseUint64(fields_[1], &movie)) {
      return absl::InvalidArgumentError(
          absl::StrCat("movieId '", fields_[1], "' is not a number"));
    }
    if (!ParseDouble(fields_[2], &rating) || rating < 0 || rating > 5) {
      return absl::InvalidArgumentError(
          absl::StrCat("rating '", fields_[2], "' is not in [0, 5]"));
    }
    if (!ParseInt64(fields_[3], &timestamp)) {
      return absl::InvalidArgumentError(
          absl::StrCat("timestamp '", fields_[3], "' is not a number"));
    }

    batch->BeginSample(rating >= kPositiveRating ? 1.0f : 0.0f);
    batch->AddKey(FeatureKey(kUserSlot, user));
    batch->EndSlot();
    batch->AddKey(FeatureKey(kMovieSlot, movie));
    batch->EndSlot();
    const auto it = movies_.find(movie);
    const MovieFeatures* features = it == movies_.end() ? nullptr : &it->second;
    if (features != nullptr) {
      for (uint64_t k : features->genres) batch->AddKey(k);
    }
    batch->EndSlot();
    if (tags_) {
      if (features != nullptr) {
        for (uint64_t k : features->tags) batch->AddKey(k);
      }
      batch->EndSlot();
    }
    return absl::OkStatus();
  }

 private:
  const MovieMap movies_;
  const bool tags_;
  std::vector<std::string> fields_;  // scratch
};

}  // namespace

absl::StatusOr<std::unique_ptr<LineParser>> MakeMovieLensParser(
    const DataConfig& config) {
  const std::filesystem::path dir(config.path);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "data.path: ", config.path,
        " is not a directory (movielens wants the one holding ratings.csv, "
        "movies.csv and tags.csv)"));
  }
  MovieMap movies;
  if (absl::Status s = LoadMovies((dir / "movies.csv").string(), &movies);
      !s.ok()) {
    return s;
  }
  if (config.movielens_tags) {
    if (absl::Status s = LoadTags((dir / "tags.csv").string(), &movies);
        !s.ok()) {
      return s;
    }
  }
  return std::make_unique<MovieLensParser>(std::move(movies),
                                           config.movielens_tags);
}

}  // namespace hetps
