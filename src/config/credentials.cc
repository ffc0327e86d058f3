// AuthConfig -> Credentials (see credentials.h).

#include "config/credentials.h"

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace hetps {
namespace {

// The file a field names; the error names the field.
absl::StatusOr<std::string> ReadField(const std::string& field,
                                      const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::string> ReadPem(const std::string& field,
                                    const std::string& path) {
  absl::StatusOr<std::string> pem = ReadField(field, path);
  if (!pem.ok()) return pem.status();
  // gRPC only says "handshake failed" about a bad PEM, much later.
  if (!absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' holds no PEM data"));
  }
  return pem;
}

// The token goes into an HTTP/2 header, so it must be one word of visible
// ASCII; the error never quotes it.
absl::StatusOr<std::string> CheckToken(const std::string& source,
                                       absl::string_view text) {
  const absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, " holds no token"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the token must be printable ASCII without spaces"));
    }
  }
  return std::string(token);
}

}  // namespace

absl::Status ResolveCredentials(
    JobConfig& config, const std::function<const char*(const char*)>& getenv) {
  const AuthConfig& auth = config.auth;
  Credentials resolved;
  if (!auth.token_file.empty()) {
    absl::StatusOr<std::string> text =
        ReadField("auth.token_file", auth.token_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::string> token = CheckToken(
        absl::StrCat("auth.token_file: '", auth.token_file, "'"), *text);
    if (!token.ok()) return token.status();
    resolved.token = *std::move(token);
  } else if (!auth.token_env.empty()) {
    const char* value = getenv(auth.token_env.c_str());
    if (value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth.token_env: environment variable ", auth.token_env,
                       " is not set"));
    }
    absl::StatusOr<std::string> token = CheckToken(
        absl::StrCat("auth.token_env: environment variable ", auth.token_env),
        value);
    if (!token.ok()) return token.status();
    resolved.token = *std::move(token);
  }
  struct PemField {
    const char* name;
    const std::string& path;
    std::string& out;
  };
  for (const PemField& f : {
           PemField{"auth.tls_ca", auth.tls_ca, resolved.ca_pem},
           PemField{"auth.tls_cert", auth.tls_cert, resolved.cert_pem},
           PemField{"auth.tls_key", auth.tls_key, resolved.key_pem},
           PemField{"auth.tls_client_cert", auth.tls_client_cert,
                    resolved.client_cert_pem},
           PemField{"auth.tls_client_key", auth.tls_client_key,
                    resolved.client_key_pem},
       }) {
    if (f.path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadPem(f.name, f.path);
    if (!pem.ok()) return pem.status();
    f.out = *std::move(pem);
  }
  resolved.require_client_cert = auth.require_client_cert;
  config.credentials = std::move(resolved);
  return absl::OkStatus();
}

}  // namespace hetps
