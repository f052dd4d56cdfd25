#include "registry-shim/route.h"

#include <algorithm>

#include "lib/oci/reference.h"

namespace shoal::shim {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) {
        return MakeError(ErrorCode::kInvalidArgument, "truncated percent-escape in request target");
      }
      int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi < 0 || lo < 0) {
        return MakeError(ErrorCode::kInvalidArgument, "bad percent-escape in request target");
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Docker Hub's one-component names get "library/"; then the name must be valid.
Result<RepoRef> FinishRepo(RepoRef repo) {
  if (repo.registry == "docker.io" && repo.repository.find('/') == std::string::npos) {
    repo.repository = "library/" + repo.repository;
  }
  if (auto st = oci::ValidateName(repo.repository); !st) return st.error();
  return repo;
}

}  // namespace

Result<Route> ParseRoute(std::string_view target) {
  Route route;
  std::string_view path = target;
  std::string_view query;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    query = target.substr(q + 1);
  }
  route.path = std::string(path);
  route.query = std::string(query);
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    auto eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == "ns") {
      auto ns = PercentDecode(pair.substr(eq + 1));
      if (!ns) return ns.error();
      route.ns = ns.value();
    }
  }
  if (path == "/metrics") {
    route.kind = Route::Kind::kMetrics;
    return route;
  }
  if (path == "/healthz" || path == "/readyz") {
    route.kind = Route::Kind::kHealth;
    return route;
  }
  if (path == "/v2" || path == "/v2/") {
    route.kind = Route::Kind::kBase;
    return route;
  }
  if (path.substr(0, 4) != "/v2/") return route;
  if (path.find('%') != std::string_view::npos) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "percent-encoded characters are not allowed in repository names");
  }
  std::string_view rest = path.substr(4);
  if (auto u = rest.find("/blobs/uploads"); u != std::string_view::npos) {
    route.kind = Route::Kind::kPush;
    route.name = std::string(rest.substr(0, u));
    return route;
  }
  constexpr std::string_view kTagsList = "/tags/list";
  if (rest.size() > kTagsList.size() && rest.ends_with(kTagsList)) {
    route.kind = Route::Kind::kTags;
    route.name = std::string(rest.substr(0, rest.size() - kTagsList.size()));
    return route;
  }
  // References and digests hold no "/", so the last marker names the endpoint (a repository
  // may well have a path component called "blobs" or "manifests").
  struct Marker {
    std::string_view text;
    Route::Kind kind;
  };
  const Marker markers[] = {{"/manifests/", Route::Kind::kManifest},
                            {"/blobs/", Route::Kind::kBlob},
                            {"/referrers/", Route::Kind::kReferrers}};
  size_t best = std::string_view::npos;
  const Marker* found = nullptr;
  for (const Marker& marker : markers) {
    size_t at = rest.rfind(marker.text);
    if (at != std::string_view::npos && (best == std::string_view::npos || at > best)) {
      best = at;
      found = &marker;
    }
  }
  // ".../blobs/" with nothing after it is no endpoint at all (as for docker-registry).
  if (found != nullptr && best + found->text.size() < rest.size()) {
    route.kind = found->kind;
    route.name = std::string(rest.substr(0, best));
    route.reference = std::string(rest.substr(best + found->text.size()));
  }
  return route;
}

std::string_view AllowedMethods(Route::Kind kind) {
  return kind == Route::Kind::kPush ? "" : "GET, HEAD";
}

Result<std::string> ForwardedQuery(std::string_view query,
                                   std::initializer_list<std::string_view> keys) {
  std::string out;
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    auto eq = pair.find('=');
    std::string_view key = pair.substr(0, eq);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    std::string_view value = eq == std::string_view::npos ? "" : pair.substr(eq + 1);
    for (size_t i = 0; i < value.size(); ++i) {
      char c = value[i];
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/' || c == ':';
      if (c == '%' && i + 2 < value.size() && HexValue(value[i + 1]) >= 0 &&
          HexValue(value[i + 2]) >= 0) {
        ok = true;
        i += 2;
      }
      if (!ok) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "query parameter " + std::string(key) +
                             " has a character that cannot "
                             "be forwarded (want letters, digits, \"-._~+/:\" or %XX)");
      }
    }
    if (!out.empty()) out += '&';
    out += std::string(key) + "=" + std::string(value);
  }
  return out;
}

Result<RepoRef> ResolveRepo(std::string_view name, const std::optional<std::string>& ns,
                            std::string_view default_registry) {
  RepoRef repo;
  if (ns && !ns->empty()) {
    if (auto st = oci::ValidateRegistryHost(*ns); !st) {
      return MakeError(ErrorCode::kInvalidArgument, "ns parameter: " + st.error().message);
    }
    repo.registry = oci::NormalizeRegistryHost(*ns);
    repo.repository = std::string(name);
    // A containerd host whose URL path already names the registry (".../v2/gcr.io" with
    // override_path) sends both: the name prefix repeats ns, so drop it.
    if (auto split = oci::SplitRegistryPrefix(name); split && split->registry == repo.registry) {
      repo.repository = split->repository;
    }
  } else if (auto split = oci::SplitRegistryPrefix(name)) {
    if (auto st = oci::ValidateRegistryHost(split->registry); !st) {
      return MakeError(ErrorCode::kInvalidArgument, "registry prefix: " + st.error().message);
    }
    repo.registry = oci::NormalizeRegistryHost(split->registry);
    repo.repository = split->repository;
  } else {
    repo.registry = oci::NormalizeRegistryHost(default_registry);
    repo.repository = std::string(name);
  }
  return FinishRepo(std::move(repo));
}

Result<RepoRef> ResolveConnectRepo(std::string_view name, std::string_view registry) {
  RepoRef repo;
  repo.registry = std::string(registry);
  repo.repository = std::string(name);
  return FinishRepo(std::move(repo));
}

}  // namespace shoal::shim
