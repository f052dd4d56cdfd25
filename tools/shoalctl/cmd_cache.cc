// `shoalctl cache ls|pin|unpin|gc`: a node agent's blob cache through its admin API
// (/shoal/v1/cache on the shim port, loopback only by default).
#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>

#include <nlohmann/json.hpp>

#include "lib/http/url.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/human.h"
#include "tools/shoalctl/json_call.h"

namespace shoal::ctl {
namespace {

namespace bhttp = boost::beast::http;

struct CacheFlags {
  std::string agent = "http://127.0.0.1:5000";
  bool json = false;
  std::vector<std::string> targets;  // pin/unpin: image references or digests
  std::string ttl;                   // pin: "3600", "90m", "24h", "7d"
  std::string owner;
  std::string platform = "linux/amd64";
  std::string to;  // gc: evict down to this budget instead of the agent's
};

// One admin request; returns (status, parsed JSON body).
Result<std::pair<unsigned, nlohmann::json>> Call(const std::string& agent_url, bhttp::verb method,
                                                 const std::string& target) {
  auto r = JsonCall(agent_url, method, target);
  if (!r) return r.error();
  return std::make_pair(r.value().status, std::move(r.value().body));
}

// Prints an admin answer's failure and returns the exit code for it (0 when it succeeded).
int Report(const Result<std::pair<unsigned, nlohmann::json>>& r, bool json) {
  if (!r) {
    std::cerr << "shoalctl cache: " << r.error().ToString() << "\n";
    return 1;
  }
  if (r.value().first != 200) {
    if (json) {
      std::cout << r.value().second.dump(2) << "\n";
    } else {
      std::cerr << "shoalctl cache: HTTP " << r.value().first << ": "
                << r.value().second.value("error", r.value().second.dump()) << "\n";
    }
    return 1;
  }
  return 0;
}

std::string Ago(int64_t unix_ms) {
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  int64_t s = (now - unix_ms) / 1000;
  char buf[32];
  if (s < 0) s = 0;
  if (s < 120) {
    std::snprintf(buf, sizeof(buf), "%llds ago", static_cast<long long>(s));
  } else if (s < 7200) {
    std::snprintf(buf, sizeof(buf), "%lldm ago", static_cast<long long>(s / 60));
  } else if (s < 172800) {
    std::snprintf(buf, sizeof(buf), "%lldh ago", static_cast<long long>(s / 3600));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd ago", static_cast<long long>(s / 86400));
  }
  return buf;
}

int RunLs(const CacheFlags& f) {
  auto r = Call(f.agent, bhttp::verb::get, "/shoal/v1/cache");
  if (int rc = Report(r, f.json); rc != 0) return rc;
  const nlohmann::json& j = r.value().second;
  if (f.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-71s %10s  %-10s %s\n", "DIGEST", "SIZE", "LAST USE", "STATE");
  for (const auto& e : j.at("entries")) {
    std::string state;
    if (e.value("pinned", false)) {
      state = "pinned";
      for (const auto& p : e.at("pins")) state += " " + p.value("owner", std::string());
    }
    if (e.value("in_use", false)) state += state.empty() ? "in-use" : ", in-use";
    std::printf("%-71s %10s  %-10s %s\n", e.value("digest", std::string()).c_str(),
                Human(e.value("size", 0.0)).c_str(), Ago(e.value("last_use_ms", int64_t{0})).c_str(),
                state.c_str());
  }
  uint64_t budget = j.value("budget", uint64_t{0});
  std::printf("%llu blobs, %s of %s budget, %s pinned, %llu evictions\n",
              static_cast<unsigned long long>(j.value("blobs", uint64_t{0})),
              Human(j.value("bytes", 0.0)).c_str(),
              budget == 0 ? "no" : Human(static_cast<double>(budget)).c_str(),
              Human(j.value("pinned_bytes", 0.0)).c_str(),
              static_cast<unsigned long long>(j.value("evictions", uint64_t{0})));
  return 0;
}

int RunPin(const CacheFlags& f, bool pin) {
  std::string query;
  if (pin && !f.ttl.empty()) {
    auto secs = ParseDuration(f.ttl);
    if (!secs) {
      std::cerr << "shoalctl cache pin: --ttl \"" << f.ttl << "\" is not a duration (90s, 15m, 24h, 7d)\n";
      return 2;
    }
    query += "&ttl=" + std::to_string(*secs);
  }
  if (!f.owner.empty()) query += "&owner=" + http::QueryEscape(f.owner);
  nlohmann::json rows = nlohmann::json::array();
  int failures = 0;
  for (const auto& t : f.targets) {
    std::string target = "/shoal/v1/cache/pins?";
    if (t.rfind("sha256:", 0) == 0) {
      target += "digest=" + http::QueryEscape(t);
    } else {
      target += "ref=" + http::QueryEscape(t) + "&platform=" + http::QueryEscape(f.platform);
    }
    target += query;
    auto r = Call(f.agent, pin ? bhttp::verb::post : bhttp::verb::delete_, target);
    nlohmann::json row = {{"target", t}};
    if (!r || r.value().first != 200) {
      ++failures;
      row["ok"] = false;
      row["error"] = !r ? r.error().ToString()
                        : r.value().second.value("error", r.value().second.dump());
      if (!f.json) {
        std::printf("%-50s FAIL  %s\n", t.c_str(), row["error"].get<std::string>().c_str());
      }
    } else {
      row["ok"] = true;
      const auto& list = r.value().second.at(pin ? "pinned" : "unpinned");
      row[pin ? "pinned" : "unpinned"] = list;
      if (!f.json) {
        std::printf("%-50s %s  %zu blobs%s\n", t.c_str(), pin ? "pinned  " : "unpinned",
                    list.size(), pin && !f.ttl.empty() ? (" for " + f.ttl).c_str() : "");
      }
    }
    rows.push_back(row);
  }
  if (f.json) std::cout << rows.dump(2) << "\n";
  return failures == 0 ? 0 : 1;
}

int RunGc(const CacheFlags& f) {
  std::string target = "/shoal/v1/cache/gc";
  if (!f.to.empty()) target += "?to=" + http::QueryEscape(f.to);
  auto r = Call(f.agent, bhttp::verb::post, target);
  if (int rc = Report(r, f.json); rc != 0) return rc;
  const nlohmann::json& j = r.value().second;
  if (f.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  uint64_t budget = j.value("budget", uint64_t{0});
  std::printf("freed %s (%zu blobs); cache now %s of %s budget", Human(j.value("freed_bytes", 0.0)).c_str(),
              j.at("evicted").size(), Human(j.value("bytes", 0.0)).c_str(),
              budget == 0 ? "no" : Human(static_cast<double>(budget)).c_str());
  if (j.value("over_budget", uint64_t{0}) > 0) {
    std::printf("; %s over budget (pinned or in use)", Human(j.value("over_budget", 0.0)).c_str());
  }
  std::printf("\n");
  return 0;
}

void AddCommon(CLI::App* cmd, const std::shared_ptr<CacheFlags>& flags) {
  cmd->add_option("--agent", flags->agent, "The node agent's registry shim URL")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_flag("--json", flags->json, "Print results as JSON");
}

}  // namespace

void AddCacheCommand(CLI::App& app) {
  auto flags = std::make_shared<CacheFlags>();
  CLI::App* cache = app.add_subcommand(
      "cache", "Inspect and manage a node agent's blob cache: ls, pin, unpin, gc");
  cache->require_subcommand(1);

  CLI::App* ls = cache->add_subcommand(
      "ls", "List cached blobs, least recently used first: digest, size, last use, pins, in use");
  AddCommon(ls, flags);
  ls->callback([flags] { throw CLI::RuntimeError(RunLs(*flags)); });

  CLI::App* pin = cache->add_subcommand(
      "pin",
      "Pin images (manifest, config and layers) or blobs by digest against eviction");
  pin->add_option("targets", flags->targets, "Image references or sha256: digests")->required();
  pin->add_option("--ttl", flags->ttl, "Pin for this long (90s, 15m, 24h, 7d); default: until unpinned")
      ->envname("SHOAL_PIN_TTL");
  pin->add_option("--owner", flags->owner, "Who holds the pin (default: operator)")
      ->envname("SHOAL_PIN_OWNER");
  pin->add_option("--platform", flags->platform, "os/arch to choose from multi-arch images")
      ->envname("SHOAL_PLATFORM")
      ->capture_default_str();
  AddCommon(pin, flags);
  pin->callback([flags] { throw CLI::RuntimeError(RunPin(*flags, true)); });

  CLI::App* unpin = cache->add_subcommand(
      "unpin", "Remove pins from images or blobs (every owner's unless --owner is given)");
  unpin->add_option("targets", flags->targets, "Image references or sha256: digests")->required();
  unpin->add_option("--owner", flags->owner, "Remove only this owner's pins")
      ->envname("SHOAL_PIN_OWNER");
  unpin->add_option("--platform", flags->platform, "os/arch to choose from multi-arch images")
      ->envname("SHOAL_PLATFORM")
      ->capture_default_str();
  AddCommon(unpin, flags);
  unpin->callback([flags] { throw CLI::RuntimeError(RunPin(*flags, false)); });

  CLI::App* gc = cache->add_subcommand(
      "gc", "Evict least recently used unpinned blobs now, down to the budget; report freed bytes");
  gc->add_option("--to", flags->to, "Evict down to this size instead (50GiB, 80%, 0)")
      ->envname("SHOAL_GC_TO");
  AddCommon(gc, flags);
  gc->callback([flags] { throw CLI::RuntimeError(RunGc(*flags)); });
}

}  // namespace shoal::ctl
