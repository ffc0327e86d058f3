// Reading the job's secrets: AuthConfig (file paths, a variable name) ->
// Credentials. Only the CLI calls this, once per process, before anything
// connects; nothing deeper reads the environment or the files.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "hetps/config.h"

namespace hetps {

// Fills config.credentials from config.auth (validated): reads the token
// from auth.token_file or the variable auth.token_env through `getenv`
// (std::getenv in production, a map in tests), and the PEM files. Errors
// are INVALID_ARGUMENT naming the field and the path or variable, never
// quoting a secret; on error config.credentials is left unchanged.
absl::Status ResolveCredentials(
    JobConfig& config, const std::function<const char*(const char*)>& getenv);

}  // namespace hetps
