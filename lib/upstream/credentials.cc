#include "lib/upstream/credentials.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/upstream/docker_auth_json.h"

namespace shoal::upstream {
namespace internal {

Result<std::optional<BasicAuth>> ParseAuthEntry(const nlohmann::json& entry,
                                                const std::string& where) {
  auto bad = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument, where + " " + std::string(why));
  };
  if (!entry.is_object()) return bad("is not an object");
  auto field = [&](const char* name) -> std::optional<std::string> {
    auto it = entry.find(name);
    if (it == entry.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  BasicAuth auth;
  if (auto encoded = field("auth"); encoded && !encoded->empty()) {
    auto decoded = Base64Decode(*encoded);
    if (!decoded) return bad("has an \"auth\" value that is not base64");
    size_t colon = decoded->find(':');
    if (colon == std::string::npos) return bad("has an \"auth\" value without user:password");
    auth.username = decoded->substr(0, colon);
    auth.password = decoded->substr(colon + 1);
    return std::optional<BasicAuth>(std::move(auth));
  }
  auto user = field("username");
  auto pass = field("password");
  if (!user || !pass || user->empty()) return std::optional<BasicAuth>();  // helper or token only
  auth.username = *user;
  auth.password = *pass;
  return std::optional<BasicAuth>(std::move(auth));
}

Status AddAuths(const nlohmann::json& auths, const std::string& source, Credentials& creds) {
  if (auths.is_null()) return Ok();
  if (!auths.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, source + ": \"auths\" is not an object");
  }
  for (const auto& item : auths.items()) {
    auto auth = ParseAuthEntry(item.value(), source + ": entry for " + item.key());
    if (!auth) return auth.error();
    if (auth.value()) creds.Add(item.key(), std::move(*auth.value()));
  }
  return Ok();
}

}  // namespace internal

std::string BasicAuthHeader(const BasicAuth& auth) {
  return "Basic " + Base64Encode(auth.username + ":" + auth.password);
}

std::optional<BasicAuth> ParseBasicAuthorization(std::string_view header) {
  while (!header.empty() && (header.front() == ' ' || header.front() == '\t')) header.remove_prefix(1);
  if (header.size() < 6) return std::nullopt;
  std::string scheme(header.substr(0, 6));
  for (char& c : scheme) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (scheme != "basic ") return std::nullopt;
  std::string_view encoded = header.substr(6);
  while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
  while (!encoded.empty() && (encoded.back() == ' ' || encoded.back() == '\t')) encoded.remove_suffix(1);
  auto decoded = Base64Decode(encoded);
  if (!decoded) return std::nullopt;
  size_t colon = decoded->find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  return BasicAuth{decoded->substr(0, colon), decoded->substr(colon + 1)};
}

std::string Credentials::NormalizeRegistry(std::string_view registry) {
  std::string_view r = registry;
  size_t scheme = r.find("://");
  if (scheme != std::string_view::npos) r.remove_prefix(scheme + 3);
  r = r.substr(0, r.find('/'));
  std::string key(r);
  for (char& c : key) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (key == "index.docker.io" || key == "registry-1.docker.io" ||
      key == "registry.hub.docker.com" || key == "hub.docker.com") {
    key = "docker.io";
  }
  return key;
}

Result<Credentials> Credentials::LoadDockerConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return MakeError(ErrorCode::kIo, "cannot read docker config " + path);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return MakeError(ErrorCode::kIo, "cannot read docker config " + path);
  // Parse without exceptions; parse errors must not echo the file's content (secrets).
  nlohmann::json doc = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "docker config " + path + " is not a JSON object");
  }
  Credentials creds;
  auto auths = doc.find("auths");
  if (auths == doc.end() || auths->is_null()) return creds;
  if (auto st = internal::AddAuths(*auths, "docker config " + path, creds); !st) return st.error();
  return creds;
}

std::optional<BasicAuth> Credentials::For(std::string_view registry) const {
  auto it = by_registry_.find(NormalizeRegistry(registry));
  if (it == by_registry_.end()) return std::nullopt;
  return it->second;
}

void Credentials::Add(std::string registry, BasicAuth auth) {
  by_registry_[NormalizeRegistry(registry)] = std::move(auth);
}

}  // namespace shoal::upstream
