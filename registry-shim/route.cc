#include "registry-shim/route.h"


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
  auto m = rest.rfind("/manifests/");
  auto b = rest.rfind("/blobs/");
  if (auto u = rest.find("/blobs/uploads"); u != std::string_view::npos) {
    route.kind = Route::Kind::kPush;
    route.name = std::string(rest.substr(0, u));
    return route;
  }
  if (m != std::string_view::npos && (b == std::string_view::npos || m > b)) {
    route.kind = Route::Kind::kManifest;
    route.name = std::string(rest.substr(0, m));
    route.reference = std::string(rest.substr(m + 11));
  } else if (b != std::string_view::npos) {
    route.kind = Route::Kind::kBlob;
    route.name = std::string(rest.substr(0, b));
    route.reference = std::string(rest.substr(b + 7));
  }
  return route;
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
