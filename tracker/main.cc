// shoal-tracker: the cluster's BitTorrent tracker and upstream-lease service.
#include <CLI/CLI.hpp>

#include "tracker/config.h"
#include "tracker/run.h"

int main(int argc, char** argv) {
  CLI::App app{"shoal-tracker: BitTorrent tracker for shoal's peer-to-peer image distribution"};
  app.set_version_flag("--version", "shoal-tracker 0.1.0");
  shoal::tracker::TrackerConfig config;
  shoal::tracker::AddTrackerFlags(app, config);
  CLI11_PARSE(app, argc, argv);
  return shoal::tracker::RunTracker(config);
}
