#include "lib/upstream/upstream_map.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lib/http/address_policy.h"
#include "lib/oci/reference.h"
#include "lib/upstream/docker_auth_json.h"

namespace shoal::upstream {
namespace {

Result<http::Url> ParseEndpoint(std::string_view registry, std::string_view text) {
  auto url = http::Url::Parse(text);
  if (!url) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "upstream for " + std::string(registry) + ": " + url.error().message);
  }
  if (url.value().target != "/" && !url.value().target.empty()) {
    // RegistryClient builds /v2/... itself; a path here would be silently dropped.
    return MakeError(ErrorCode::kInvalidArgument,
                     "upstream for " + std::string(registry) + ": " + url.value().Redacted() +
                         " has a path; give scheme://host[:port] only");
  }
  url.value().target = "/";
  return url.value();
}

}  // namespace

UpstreamMap::UpstreamMap() {
  entries_["docker.io"] = http::Url::Parse("https://registry-1.docker.io").value();
}

std::string UpstreamMap::Key(std::string_view registry) {
  std::string key(registry);
  for (char& c : key) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (key == "registry.hub.docker.com") key = "docker.io";
  return oci::NormalizeRegistryHost(key);
}

Status UpstreamMap::Add(std::string_view registry, std::string_view url) {
  std::string key = Key(registry);
  if (auto st = oci::ValidateRegistryHost(key); !st) {
    return MakeError(ErrorCode::kInvalidArgument, "upstream map: " + st.error().message);
  }
  auto endpoint = ParseEndpoint(key, url);
  if (!endpoint) return endpoint.error();
  entries_[key] = std::move(endpoint.value());
  return Ok();
}

Status UpstreamMap::AddSpecs(const std::vector<std::string>& specs) {
  for (const auto& spec : specs) {
    if (spec.empty()) continue;
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "upstream map entry \"" + spec + "\" must be REGISTRY=URL");
    }
    if (auto st = Add(spec.substr(0, eq), spec.substr(eq + 1)); !st) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "upstream map entry \"" + spec + "\": " + st.error().message);
    }
  }
  return Ok();
}

Status UpstreamMap::SetUnmapped(std::string_view policy) {
  if (policy == "https") {
    unmapped_ = Unmapped::kHttps;
  } else if (policy == "error") {
    unmapped_ = Unmapped::kError;
  } else {
    auto endpoint = ParseEndpoint("unmapped registries", policy);
    if (!endpoint) {
      return MakeError(
          ErrorCode::kInvalidArgument,
          "unmapped policy must be \"https\", \"error\" or a URL: " + endpoint.error().message);
    }
    unmapped_ = Unmapped::kEndpoint;
    unmapped_endpoint_ = std::move(endpoint.value());
  }
  return Ok();
}

Result<UpstreamMap::PullAuth> UpstreamMap::ParsePullAuth(std::string_view mode) {
  if (mode == "client") return PullAuth::kClient;
  if (mode == "node") return PullAuth::kNode;
  if (mode == "deny") return PullAuth::kDeny;
  return MakeError(ErrorCode::kInvalidArgument,
                   "pull_auth \"" + std::string(mode.substr(0, 64)) +
                       "\" is not one of \"client\", \"node\", \"deny\"");
}

std::string_view UpstreamMap::PullAuthName(PullAuth mode) {
  switch (mode) {
    case PullAuth::kClient:
      return "client";
    case PullAuth::kNode:
      return "node";
    case PullAuth::kDeny:
      return "deny";
  }
  return "client";
}

Status UpstreamMap::SetPullAuth(std::string_view spec) {
  auto eq = spec.find('=');
  auto mode = ParsePullAuth(eq == std::string_view::npos ? spec : spec.substr(eq + 1));
  if (!mode) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--pull-auth \"" + std::string(spec.substr(0, 200)) + "\": " +
                         mode.error().message + " (give MODE or REGISTRY=MODE)");
  }
  if (eq == std::string_view::npos) {
    default_pull_auth_ = mode.value();
    return Ok();
  }
  std::string key = Key(spec.substr(0, eq));
  if (auto st = oci::ValidateRegistryHost(key); !st) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--pull-auth \"" + std::string(spec.substr(0, 200)) + "\": " +
                         st.error().message);
  }
  pull_auth_[key] = mode.value();
  return Ok();
}

UpstreamMap::PullAuth UpstreamMap::PullAuthFor(std::string_view registry) const {
  auto it = pull_auth_.find(Key(registry));
  return it == pull_auth_.end() ? default_pull_auth_ : it->second;
}

Status UpstreamMap::LoadFile(const std::string& path, Credentials& credentials) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(ErrorCode::kIo, "cannot read upstream map " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return MakeError(ErrorCode::kIo, "cannot read upstream map " + path);
  // No exceptions: a parse error message would quote the file, and it may hold secrets.
  nlohmann::json doc = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  const std::string source = "upstream map " + path;
  if (doc.is_discarded() || !doc.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, source + " is not a JSON object");
  }
  for (const auto& item : doc.items()) {
    const std::string& k = item.key();
    if (k != "upstreams" && k != "auths" && k != "unmapped" && k != "pull_auth") {
      return MakeError(ErrorCode::kInvalidArgument,
                       source + ": unknown key \"" + k +
                           "\" (expected \"upstreams\", \"auths\", \"unmapped\", \"pull_auth\")");
    }
  }
  // Parse into copies so that a bad file changes nothing.
  UpstreamMap next = *this;
  Credentials creds = credentials;
  if (auto auths = doc.find("auths"); auths != doc.end()) {
    if (auto st = internal::AddAuths(*auths, source, creds); !st) return st.error();
  }
  if (auto ups = doc.find("upstreams"); ups != doc.end()) {
    if (!ups->is_object()) {
      return MakeError(ErrorCode::kInvalidArgument, source + ": \"upstreams\" is not an object");
    }
    for (const auto& item : ups->items()) {
      const std::string& registry = item.key();
      const nlohmann::json& entry = item.value();
      const std::string where = source + ": upstream " + registry;
      std::string url;
      if (entry.is_string()) {
        url = entry.get<std::string>();
      } else if (entry.is_object() && entry.contains("url") && entry["url"].is_string()) {
        url = entry["url"].get<std::string>();
        if (auto mode = entry.find("pull_auth"); mode != entry.end()) {
          if (!mode->is_string()) {
            return MakeError(ErrorCode::kInvalidArgument, where + ": \"pull_auth\" is not a string");
          }
          auto parsed = ParsePullAuth(mode->get<std::string>());
          if (!parsed) {
            return MakeError(ErrorCode::kInvalidArgument, where + ": " + parsed.error().message);
          }
          next.pull_auth_[Key(registry)] = parsed.value();
        }
        auto auth = internal::ParseAuthEntry(entry, where);
        if (!auth) return auth.error();
        if (auth.value()) creds.Add(Key(registry), std::move(*auth.value()));
      } else {
        return MakeError(ErrorCode::kInvalidArgument,
                         where + " must be a URL string or an object with \"url\"");
      }
      if (auto st = next.Add(registry, url); !st) {
        return MakeError(ErrorCode::kInvalidArgument, where + ": " + st.error().message);
      }
    }
  }
  if (auto policy = doc.find("unmapped"); policy != doc.end()) {
    if (!policy->is_string()) {
      return MakeError(ErrorCode::kInvalidArgument, source + ": \"unmapped\" is not a string");
    }
    if (auto st = next.SetUnmapped(policy->get<std::string>()); !st) {
      return MakeError(ErrorCode::kInvalidArgument, source + ": " + st.error().message);
    }
  }
  if (auto mode = doc.find("pull_auth"); mode != doc.end()) {
    if (!mode->is_string()) {
      return MakeError(ErrorCode::kInvalidArgument, source + ": \"pull_auth\" is not a string");
    }
    auto parsed = ParsePullAuth(mode->get<std::string>());
    if (!parsed) return MakeError(ErrorCode::kInvalidArgument, source + ": " + parsed.error().message);
    next.default_pull_auth_ = parsed.value();
  }
  *this = std::move(next);
  credentials = std::move(creds);
  return Ok();
}

Result<RegistryEndpoint> UpstreamMap::Resolve(std::string_view registry) const {
  std::string key = Key(registry);
  if (auto it = entries_.find(key); it != entries_.end()) return RegistryEndpoint{key, it->second};
  std::string mapped;
  for (const auto& [name, url] : entries_) mapped += (mapped.empty() ? "" : ", ") + name;
  const std::string unmapped =
      "registry " + key + " is not in this agent's upstream map (mapped: " + mapped + ")";
  switch (unmapped_) {
    case Unmapped::kEndpoint:
      // The operator's endpoint: it is reached wherever it is, as a map entry is.
      return RegistryEndpoint{key, unmapped_endpoint_};
    case Unmapped::kHttps: {
      auto url = http::Url::Parse("https://" + key);
      if (!url) return url.error();
      // The client chose this host: an IP literal is checked here, before any other work; a
      // name is checked by the HTTP client once resolved.
      if (http::IsGlobalLiteral(url.value().host) == false) {
        return MakeError(ErrorCode::kRefused,
                         unmapped +
                             " and is not a global address (--unmapped https reaches "
                             "public registries only)");
      }
      return RegistryEndpoint{key, url.value(), http::AddressPolicy::kGlobalOnly};
    }
    case Unmapped::kError:
      break;
  }
  return MakeError(ErrorCode::kRefused, unmapped);
}

bool UpstreamMap::Contains(std::string_view registry) const {
  return entries_.count(Key(registry)) > 0;
}

std::vector<std::string> UpstreamMap::Registries() const {
  std::vector<std::string> out;
  for (const auto& [name, url] : entries_) out.push_back(name);
  return out;
}

std::string UpstreamMap::Describe() const {
  std::string out;
  for (const auto& [name, url] : entries_) {
    out += name + " -> " + url.str() + " (pull_auth " + std::string(PullAuthName(PullAuthFor(name))) +
           "); ";
  }
  switch (unmapped_) {
    case Unmapped::kHttps:
      out += "other registries -> https://<registry>";
      break;
    case Unmapped::kError:
      out += "other registries refused";
      break;
    case Unmapped::kEndpoint:
      out += "other registries -> " + unmapped_endpoint_.str();
      break;
  }
  out += "; pull_auth " + std::string(PullAuthName(default_pull_auth_)) + " by default";
  return out;
}

}  // namespace shoal::upstream
