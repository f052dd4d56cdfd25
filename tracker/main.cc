// shoal-tracker: the cluster's BitTorrent tracker, chunk lease authority and manifest cache.
#include <iostream>

#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"shoal-tracker: swarm tracker, upstream lease authority and manifest cache"};
  app.set_version_flag("--version", "shoal-tracker 0.1.0");
  std::string listen = "0.0.0.0:7070";
  app.add_option("--listen", listen, "address:port to serve announce, leases and /metrics")
      ->envname("SHOAL_TRACKER_LISTEN");
  CLI11_PARSE(app, argc, argv);
  std::cerr << "shoal-tracker: the swarm tracker is not implemented yet (see the issue \"The "
               "swarm: tracker, chunked peer-to-peer layer distribution\")\n";
  return 2;
}
