#include "common/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace hetps {

void SetupLogging(const std::string& level, const std::string& role) {
  // stderr, so a role's stdout stays free for results a caller may parse.
  auto logger = spdlog::stderr_logger_mt("hetps:" + role);
  logger->set_pattern("%H:%M:%S.%e %^%L%$ [" + role + "] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

void LogToFileQuietly(const std::string& path) {
  auto logger = spdlog::default_logger();
  for (auto& sink : logger->sinks()) sink->set_level(spdlog::level::warn);
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, true);
  file->set_pattern("%H:%M:%S.%e %L %v");
  logger->sinks().push_back(file);
}

}  // namespace hetps
