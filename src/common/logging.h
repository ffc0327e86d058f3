// Logging for every hetps component: include this, not spdlog directly.
// SetupLogging is called once per process by the CLI.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/string_view.h"

// Debian builds abseil with its own absl::string_view (not std::string_view),
// which is what absl::Status::message() returns; let spdlog print it.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  auto format(absl::string_view s, fmt::format_context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(s.data(), s.size()), ctx);
  }
};

namespace hetps {

// `level`: trace | debug | info | warn | error (validated by the config).
// `role` (e.g. "server 0", "worker 2", "launch") is put in every line.
void SetupLogging(const std::string& level, const std::string& role);

// Also writes every line to `path` (created or truncated), and from now on
// shows only warnings and errors on stderr (a quiet launch).
void LogToFileQuietly(const std::string& path);

}  // namespace hetps
