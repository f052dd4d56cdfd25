#pragma once
// A real Bearer token server for docker-registry's `auth: token` mode: its own CA and signing
// certificate (made with the openssl CLI), RS256 JWTs with an x5c header, Basic credentials.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/sync_server.h"

namespace shoal::testkit {

struct TokenServerOptions {
  std::string user = "alice";
  std::string password = "s3cret";
  // Grant pull-only tokens to requests without credentials.
  bool allow_anonymous = false;
  std::string service = "shoal-test-registry";
  std::string issuer = "shoal-test-token-issuer";
  int expires_in_s = 300;
};

// Serves GET /token?service=..&scope=repository:NAME:pull,push (Basic auth or anonymous) and
// POST /token (OAuth2 password grant form), answering
// {"token":..., "access_token":..., "expires_in":N, "issued_at":...}; wrong credentials get 401.
// Granted actions are the requested ones (pull only for anonymous). Thread-safe.
class TokenServer {
 public:
  // Generates the CA and signing key in a TempDir and listens on 127.0.0.1. Errors:
  // kUnavailable (openssl failed, cannot listen).
  static Result<std::unique_ptr<TokenServer>> Start(TokenServerOptions options = {});
  ~TokenServer();
  TokenServer(const TokenServer&) = delete;
  TokenServer& operator=(const TokenServer&) = delete;

  // "http://127.0.0.1:PORT/token": the realm.
  std::string Realm() const;
  // PEM of the root CA that signed the token signing certificate.
  const std::string& RootCertPath() const { return ca_cert_path_; }
  // Options for Registry::Start giving a registry that trusts this server (auth kToken, realm,
  // service, issuer, rootcert, and user/password set to this server's credentials).
  RegistryOptions ForRegistry() const;
  // Token requests answered so far (granted or refused).
  uint64_t TokenRequests() const;
  // Token requests refused (401 for wrong or missing credentials, other 4xx when malformed).
  uint64_t Refused() const;
  // Issues a token for `scope` ("repository:NAME:pull"), as the endpoint would for the
  // configured user. For tests that talk to the registry by hand.
  std::string IssueToken(const std::string& scope) const;
  // Stops listening. Idempotent.
  void Stop();

 private:
  explicit TokenServer(TokenServerOptions options);
  // Handles GET/POST /token.
  SyncHttpServer::Response Handle(const SyncHttpServer::Request& request);
  // Signs claims for `subject` granting `scopes` (already filtered).
  std::string Sign(const std::string& subject, const std::vector<std::string>& scopes) const;

  TokenServerOptions options_;
  std::unique_ptr<TempDir> dir_;
  std::string ca_cert_path_;
  std::string signing_key_pem_;
  std::string signing_cert_der_b64_;  // the x5c entry
  std::unique_ptr<SyncHttpServer> server_;
  mutable std::mutex mu_;
  uint64_t requests_ = 0;  // GUARDED_BY(mu_)
  uint64_t refused_ = 0;   // GUARDED_BY(mu_)
};

}  // namespace shoal::testkit
