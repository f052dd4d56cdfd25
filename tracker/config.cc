#include "tracker/config.h"

namespace shoal::tracker {

void AddTrackerFlags(CLI::App& app, TrackerConfig& c) {
  app.add_option("--listen", c.listen, "Address host:port for announce, scrape and /metrics")
      ->envname("SHOAL_LISTEN")
      ->capture_default_str();
  app.add_option("--port-file", c.port_file, "Write the bound port to this file")
      ->envname("SHOAL_PORT_FILE");
  app.add_option("--announce-interval", c.announce_interval_s,
                 "Seconds between a peer's announces (the reply's interval, plus up to 10% "
                 "jitter); silent peers are dropped after two intervals and a minute. libtorrent "
                 "re-announces at max(interval, its min_announce_interval, default 300): below "
                 "300, lower that setting in the agents too")
      ->envname("SHOAL_ANNOUNCE_INTERVAL")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--min-interval", c.min_interval_s,
                 "The reply's min interval: the shortest time between forced announces")
      ->envname("SHOAL_MIN_INTERVAL")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--default-numwant", c.default_numwant,
                 "Peers returned when the client does not send numwant")
      ->envname("SHOAL_DEFAULT_NUMWANT")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--max-numwant", c.max_numwant, "Most peers returned by one announce")
      ->envname("SHOAL_MAX_NUMWANT")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--max-swarms", c.max_swarms, "Most swarms (info-hashes) tracked at once")
      ->envname("SHOAL_MAX_SWARMS")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(100'000'000)))
      ->capture_default_str();
  app.add_option("--max-peers-per-swarm", c.max_peers_per_swarm, "Most peers stored per swarm")
      ->envname("SHOAL_MAX_PEERS_PER_SWARM")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(10'000'000)))
      ->capture_default_str();
  app.add_option("--max-peers", c.max_peers, "Most peers stored over all swarms")
      ->envname("SHOAL_MAX_PEERS")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(1'000'000'000)))
      ->capture_default_str();
  app.add_flag("--trust-ip-param", c.trust_ip_param,
               "Use the announce's ip= parameter instead of the connection's source address "
               "(only behind a proxy that sets it; any client could claim any address)")
      ->envname("SHOAL_TRUST_IP_PARAM");
  app.add_option("--max-connections", c.max_connections, "Open HTTP connections at most")
      ->envname("SHOAL_MAX_CONNECTIONS")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--log-format", c.log_format, "json or text")
      ->envname("SHOAL_LOG_FORMAT")
      ->check(CLI::IsMember({"json", "text"}))
      ->capture_default_str();
  app.add_option("--log-level", c.log_level, "trace, debug, info, warn or error")
      ->envname("SHOAL_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

}  // namespace shoal::tracker
