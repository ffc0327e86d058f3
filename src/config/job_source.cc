// BuildJobConfig (hetps/config.h): file, overrides, absolute paths.
#include <filesystem>

#include "hetps/config.h"

namespace hetps {
namespace {

std::vector<std::string*> PathFields(JobConfig& config) {
  AuthConfig& auth = config.auth;
  return {&config.train.data.path, &auth.token_file, &auth.tls_ca,
          &auth.tls_cert,          &auth.tls_key,    &auth.tls_client_cert,
          &auth.tls_client_key};
}

}  // namespace

absl::StatusOr<JobConfig> BuildJobConfig(
    const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  JobConfig config;
  if (!path.empty()) {
    auto loaded = LoadJobConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
    for (std::string* p : PathFields(config)) {
      if (!p->empty() && fs::path(*p).is_relative()) {
        *p =
            (fs::absolute(path).parent_path() / *p).lexically_normal().string();
      }
    }
  }
  for (const std::string& o : overrides) {
    if (auto s = ApplyOverride(config, o); !s.ok()) return s;
  }
  for (std::string* p : PathFields(config)) {
    if (!p->empty()) *p = fs::absolute(*p).string();
  }
  return config;
}

}  // namespace hetps
