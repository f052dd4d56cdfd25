// shoalctl: the operator's command line for shoal.
#include <CLI/CLI.hpp>

#include "tools/shoalctl/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"shoalctl: operate shoal (peer-to-peer container image distribution)"};
  app.set_version_flag("--version", "shoalctl 0.1.0");
  app.require_subcommand(1);
  shoal::ctl::AddPullCommand(app);
  shoal::ctl::AddStatusCommand(app);
  shoal::ctl::AddExtractCommand(app);
  shoal::ctl::AddConfigCommand(app);
  shoal::ctl::AddSaveCommand(app);
  shoal::ctl::AddCacheCommand(app);
  shoal::ctl::AddPrefetchCommand(app);
  shoal::ctl::AddNodeSetupCommand(app);
  shoal::ctl::AddDoctorCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
