#include "tests/support/token_server.h"

#include <atomic>
#include <chrono>
#include <ctime>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <nlohmann/json.hpp>

#include "lib/core/base64.h"

namespace shoal::testkit {
namespace {

namespace http = boost::beast::http;
using json = nlohmann::json;

// Minimal OpenSSL config: a CA that may sign, and a leaf for signatures only. Written to a file
// so that the host's openssl.cnf defaults do not matter.
constexpr char kOpensslConf[] = R"([req]
distinguished_name = dn
x509_extensions = v3_ca
prompt = no
[dn]
CN = shoal-test-ca
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
)";

std::string Base64Url(const std::string& in) {
  std::string s = Base64Encode(in);
  for (char& c : s) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  while (!s.empty() && s.back() == '=') s.pop_back();
  return s;
}

std::string UrlDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(s[i + 1]) &&
               std::isxdigit(s[i + 2])) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// key=value pairs of a query string or form body, in order (keys may repeat, e.g. scope).
std::vector<std::pair<std::string, std::string>> ParseForm(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t amp = s.find('&', pos);
    if (amp == std::string::npos) amp = s.size();
    std::string kv = s.substr(pos, amp - pos);
    if (!kv.empty()) {
      size_t eq = kv.find('=');
      out.emplace_back(UrlDecode(kv.substr(0, eq)),
                       eq == std::string::npos ? "" : UrlDecode(kv.substr(eq + 1)));
    }
    pos = amp + 1;
  }
  return out;
}

std::string Rfc3339(std::time_t t) {
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

SyncHttpServer::Response JsonResponse(http::status status, const json& body) {
  SyncHttpServer::Response res(status, 11);
  res.set(http::field::content_type, "application/json");
  res.body() = body.dump();
  return res;
}

}  // namespace

TokenServer::TokenServer(TokenServerOptions options) : options_(std::move(options)) {}

TokenServer::~TokenServer() { Stop(); }

Result<std::unique_ptr<TokenServer>> TokenServer::Start(TokenServerOptions options) {
  std::unique_ptr<TokenServer> ts(new TokenServer(std::move(options)));
  ts->dir_ = std::make_unique<TempDir>("shoal-token");
  const TempDir& d = *ts->dir_;
  WriteFile(d.Sub("openssl.cnf"), kOpensslConf);
  const std::vector<std::vector<std::string>> commands = {
      {"openssl", "req", "-x509", "-config", d.Sub("openssl.cnf"), "-newkey", "rsa:2048", "-nodes",
       "-keyout", d.Sub("ca.key"), "-out", d.Sub("ca.crt"), "-days", "3650"},
      {"openssl", "req", "-new", "-config", d.Sub("openssl.cnf"), "-newkey", "rsa:2048", "-nodes",
       "-subj", "/CN=shoal-token-signer", "-keyout", d.Sub("signing.key"), "-out",
       d.Sub("signing.csr")},
      {"openssl", "x509", "-req", "-in", d.Sub("signing.csr"), "-CA", d.Sub("ca.crt"), "-CAkey",
       d.Sub("ca.key"), "-set_serial", "2", "-days", "3650", "-extfile", d.Sub("openssl.cnf"),
       "-extensions", "v3_leaf", "-out", d.Sub("signing.crt")},
  };
  for (const auto& argv : commands) {
    auto out = RunCommand(argv, std::chrono::seconds(120));
    if (!out) return out.error();
  }
  ts->ca_cert_path_ = d.Sub("ca.crt");
  ts->signing_key_pem_ = ReadFile(d.Sub("signing.key"));

  // x5c holds the DER certificate, standard base64.
  std::string cert_pem = ReadFile(d.Sub("signing.crt"));
  BIO* bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (!cert) return MakeError(ErrorCode::kUnavailable, "cannot parse " + d.Sub("signing.crt"));
  unsigned char* der = nullptr;
  int der_len = i2d_X509(cert, &der);
  X509_free(cert);
  if (der_len <= 0) return MakeError(ErrorCode::kUnavailable, "i2d_X509 failed");
  ts->signing_cert_der_b64_ = Base64Encode(std::string(reinterpret_cast<char*>(der), der_len));
  OPENSSL_free(der);

  auto server = SyncHttpServer::Start(
      [raw = ts.get()](const SyncHttpServer::Request& r) { return raw->Handle(r); });
  if (!server) return server.error();
  ts->server_ = std::move(server.value());
  return ts;
}

std::string TokenServer::Realm() const { return "http://" + server_->HostPort() + "/token"; }

RegistryOptions TokenServer::ForRegistry() const {
  RegistryOptions o;
  o.auth = RegistryOptions::Auth::kToken;
  o.user = options_.user;
  o.password = options_.password;
  o.token_realm = Realm();
  o.token_service = options_.service;
  o.token_issuer = options_.issuer;
  o.token_rootcert = ca_cert_path_;
  return o;
}

uint64_t TokenServer::TokenRequests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

uint64_t TokenServer::Refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

void TokenServer::Stop() {
  if (server_) server_->Stop();
}

std::string TokenServer::IssueToken(const std::string& scope) const {
  return Sign(options_.user, {scope});
}

std::string TokenServer::Sign(const std::string& subject,
                              const std::vector<std::string>& scopes) const {
  static std::atomic<uint64_t> counter{0};
  json access = json::array();
  for (const auto& scope : scopes) {
    // type:name:actions; the name itself may contain ':' (e.g. a port).
    size_t first = scope.find(':');
    size_t last = scope.rfind(':');
    if (first == std::string::npos || first == last) continue;
    json actions = json::array();
    std::string list = scope.substr(last + 1);
    for (size_t pos = 0; pos <= list.size();) {
      size_t comma = list.find(',', pos);
      if (comma == std::string::npos) comma = list.size();
      if (comma > pos) actions.push_back(list.substr(pos, comma - pos));
      pos = comma + 1;
    }
    access.push_back({{"type", scope.substr(0, first)},
                      {"name", scope.substr(first + 1, last - first - 1)},
                      {"actions", actions}});
  }
  std::time_t now = std::time(nullptr);
  json header = {{"typ", "JWT"}, {"alg", "RS256"}, {"x5c", {signing_cert_der_b64_}}};
  json claims = {{"iss", options_.issuer},
                 {"sub", subject},
                 {"aud", options_.service},
                 {"exp", now + options_.expires_in_s},
                 {"nbf", now - 10},
                 {"iat", now},
                 {"jti", std::to_string(now) + "-" + std::to_string(++counter)},
                 {"access", access}};
  std::string signing_input = Base64Url(header.dump()) + "." + Base64Url(claims.dump());

  BIO* bio = BIO_new_mem_buf(signing_key_pem_.data(), static_cast<int>(signing_key_pem_.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  std::string sig;
  if (key) {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    size_t len = 0;
    if (EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key) == 1 &&
        EVP_DigestSign(ctx, nullptr, &len,
                       reinterpret_cast<const unsigned char*>(signing_input.data()),
                       signing_input.size()) == 1) {
      sig.resize(len);
      if (EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                         reinterpret_cast<const unsigned char*>(signing_input.data()),
                         signing_input.size()) == 1) {
        sig.resize(len);
      } else {
        sig.clear();
      }
    }
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
  }
  return signing_input + "." + Base64Url(sig);
}

SyncHttpServer::Response TokenServer::Handle(const SyncHttpServer::Request& req) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_;
  }
  auto refuse = [&](http::status status, const std::string& code, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    ++refused_;
    auto res = JsonResponse(status, {{"errors", {{{"code", code}, {"message", message}}}}});
    if (status == http::status::unauthorized) {
      res.set(http::field::www_authenticate, "Basic realm=\"shoal-test-token\"");
    }
    return res;
  };
  std::string target(req.target());
  std::string path = target.substr(0, target.find('?'));
  if (path != "/token") return refuse(http::status::not_found, "NOT_FOUND", "no such endpoint");

  std::vector<std::pair<std::string, std::string>> params;
  std::string user, password;
  bool has_credentials = false;
  bool oauth = req.method() == http::verb::post;
  if (oauth) {
    params = ParseForm(req.body());
    std::string grant;
    for (const auto& [k, v] : params) {
      if (k == "grant_type") grant = v;
      if (k == "username") user = v;
      if (k == "password") password = v;
    }
    if (grant != "password") {
      return refuse(http::status::bad_request, "UNSUPPORTED", "only grant_type=password");
    }
    has_credentials = true;
  } else if (req.method() == http::verb::get) {
    if (target.find('?') != std::string::npos)
      params = ParseForm(target.substr(target.find('?') + 1));
    std::string auth(req[http::field::authorization]);
    if (auth.rfind("Basic ", 0) == 0) {
      std::string decoded = Base64Decode(auth.substr(6)).value_or("");
      size_t colon = decoded.find(':');
      if (colon == std::string::npos) {
        return refuse(http::status::unauthorized, "UNAUTHORIZED", "malformed Basic credentials");
      }
      user = decoded.substr(0, colon);
      password = decoded.substr(colon + 1);
      has_credentials = true;
    }
  } else {
    return refuse(http::status::method_not_allowed, "UNSUPPORTED", "GET or POST only");
  }

  if (has_credentials && (user != options_.user || password != options_.password)) {
    return refuse(http::status::unauthorized, "UNAUTHORIZED", "wrong user or password");
  }
  if (!has_credentials && !options_.allow_anonymous) {
    return refuse(http::status::unauthorized, "UNAUTHORIZED", "credentials required");
  }
  std::vector<std::string> scopes;
  for (const auto& [k, v] : params) {
    if (k != "scope") continue;
    // Several scopes may also come space-separated in one parameter.
    for (size_t pos = 0; pos <= v.size();) {
      size_t sp = v.find(' ', pos);
      if (sp == std::string::npos) sp = v.size();
      if (sp > pos) scopes.push_back(v.substr(pos, sp - pos));
      pos = sp + 1;
    }
  }
  if (!has_credentials) {
    // Anonymous: pull only.
    for (auto& s : scopes) {
      size_t last = s.rfind(':');
      std::string actions = s.substr(last + 1);
      s = s.substr(0, last + 1) + (actions.find("pull") != std::string::npos ? "pull" : "");
    }
  }
  std::string token = Sign(has_credentials ? user : "", scopes);
  json body = {{"token", token},
               {"access_token", token},
               {"expires_in", options_.expires_in_s},
               {"issued_at", Rfc3339(std::time(nullptr))}};
  return JsonResponse(http::status::ok, body);
}

}  // namespace shoal::testkit
