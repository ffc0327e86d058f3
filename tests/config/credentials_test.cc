// AuthConfig checks (ValidateJobConfig) and reading the secrets
// (ResolveCredentials): each mistake is an error naming the field, and no
// error quotes a token.
#include "config/credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::SourcePath;
using ::hetps::testing::StatusIs;
using ::hetps::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::kInvalid;

std::function<const char*(const char*)> Env(
    const std::map<std::string, std::string>& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

absl::Status Validate(const std::string& yaml) {
  absl::StatusOr<JobConfig> config = ParseJobConfigYaml(yaml);
  if (!config.ok()) return config.status();
  return ValidateJobConfig(*config);
}

JobConfig WithTokenFile(const std::string& path) {
  JobConfig config;
  config.auth.token_file = path;
  return config;
}

JobConfig WithTokenEnv(const std::string& name) {
  JobConfig config;
  config.auth.token_env = name;
  return config;
}

TEST(AuthConfigTest, InconsistentFieldsNameTheField) {
  EXPECT_THAT(Validate("auth: {token_file: t, token_env: HETPS_TOKEN}"),
              StatusIs(kInvalid, HasSubstr("auth.token_env: set "
                                           "auth.token_file or auth.token_env, "
                                           "not both")));
  EXPECT_THAT(
      Validate("auth: {tls_ca: ca.pem}"),
      StatusIs(kInvalid, HasSubstr("auth.tls_ca, auth.tls_cert, auth.tls_key: "
                                   "set all three or none")));
  EXPECT_THAT(Validate("auth: {tls_ca: a, tls_cert: b, tls_key: c, "
                       "require_client_cert: true}"),
              StatusIs(kInvalid, HasSubstr("auth.require_client_cert: needs")));
  // The token itself is no config field: it would end up in files and
  // command lines.
  EXPECT_THAT(Validate("auth: {token: abc}"),
              StatusIs(kInvalid, HasSubstr("auth.token")));
  EXPECT_TRUE(
      Validate("auth: {token_env: HETPS_TOKEN, tls_ca: a, tls_cert: b, "
               "tls_key: c, require_client_cert: true, tls_client_cert: d, "
               "tls_client_key: e}")
          .ok());
}

TEST(ResolveCredentialsTest, ReadsTokenFileTrimmed) {
  TempDir dir;
  JobConfig config = WithTokenFile(dir.Write("token", "  tok-123\n"));
  ASSERT_TRUE(ResolveCredentials(config, Env({})).ok());
  EXPECT_EQ(config.credentials.token, "tok-123");
  EXPECT_TRUE(config.credentials.ca_pem.empty());
}

TEST(ResolveCredentialsTest, ReadsTokenFromTheNamedVariable) {
  JobConfig config = WithTokenEnv("JOB_TOKEN");
  ASSERT_TRUE(
      ResolveCredentials(config, Env({{"JOB_TOKEN", "from-env"}})).ok());
  EXPECT_EQ(config.credentials.token, "from-env");

  JobConfig unset = WithTokenEnv("JOB_TOKEN");
  EXPECT_THAT(ResolveCredentials(unset, Env({})),
              StatusIs(kInvalid, HasSubstr("auth.token_env: environment "
                                           "variable JOB_TOKEN is not set")));
}

TEST(ResolveCredentialsTest, BadTokensAreRefusedWithoutQuotingThem) {
  TempDir dir;
  JobConfig missing = WithTokenFile(dir.path() + "/nope");
  EXPECT_THAT(ResolveCredentials(missing, Env({})),
              StatusIs(kInvalid, AllOf(HasSubstr("auth.token_file: cannot "
                                                 "read '"),
                                       HasSubstr("/nope"))));
  JobConfig empty = WithTokenFile(dir.Write("empty", "\n"));
  EXPECT_THAT(ResolveCredentials(empty, Env({})),
              StatusIs(kInvalid, HasSubstr("holds no token")));
  JobConfig spaced = WithTokenFile(dir.Write("spaced", "two words"));
  EXPECT_THAT(ResolveCredentials(spaced, Env({})),
              StatusIs(kInvalid, AllOf(HasSubstr("printable ASCII"),
                                       Not(HasSubstr("two words")))));
  EXPECT_TRUE(spaced.credentials.token.empty());
}

TEST(ResolveCredentialsTest, ReadsPemFilesAndNamesAMissingOne) {
  JobConfig config;
  config.auth.tls_ca = SourcePath("tests/data/tls/ca.pem");
  config.auth.tls_cert = SourcePath("tests/data/tls/server.pem");
  config.auth.tls_key = SourcePath("tests/data/tls/server.key");
  config.auth.require_client_cert = true;
  config.auth.tls_client_cert = SourcePath("tests/data/tls/client.pem");
  config.auth.tls_client_key = SourcePath("tests/data/tls/client.key");
  ASSERT_TRUE(ResolveCredentials(config, Env({})).ok());
  EXPECT_THAT(config.credentials.ca_pem, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(config.credentials.key_pem, HasSubstr("PRIVATE KEY"));
  EXPECT_THAT(config.credentials.client_cert_pem,
              HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_TRUE(config.credentials.require_client_cert);

  TempDir dir;
  config.auth.tls_key = dir.Write("key.pem", "not a key");
  EXPECT_THAT(ResolveCredentials(config, Env({})),
              StatusIs(kInvalid, HasSubstr("auth.tls_key: '")));
  config.auth.tls_key = dir.path() + "/absent.key";
  EXPECT_THAT(ResolveCredentials(config, Env({})),
              StatusIs(kInvalid, HasSubstr("auth.tls_key: cannot read")));
}

}  // namespace
}  // namespace hetps
