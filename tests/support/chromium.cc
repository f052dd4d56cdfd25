#include "tests/support/chromium.h"

#include <chrono>
#include <vector>

#include "tests/support/process.h"

namespace shoal::testkit {

Result<std::string> RenderPage(const std::string& profile_dir, const std::string& url, int width,
                               int height, const std::string& png) {
  std::vector<std::string> argv = {
      "chromium",
      "--headless=new",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--no-first-run",
      "--user-data-dir=" + profile_dir,
      "--window-size=" + std::to_string(width) + "," + std::to_string(height),
      "--virtual-time-budget=6000"};
  // One run does both: the DOM is dumped and the screenshot taken once the virtual time is
  // spent, so the picture shows the DOM that is returned.
  if (!png.empty()) argv.push_back("--screenshot=" + png);
  argv.push_back("--dump-dom");
  argv.push_back(url);
  return RunCommand(argv, std::chrono::seconds(90));
}

std::string PageValue(const std::string& dom, const std::string& id) {
  std::string open = "id=\"" + id + "\"";
  size_t at = dom.find(open);
  if (at == std::string::npos) return "";
  size_t end = dom.find('>', at);
  size_t v = dom.find("data-value=\"", at);
  if (v == std::string::npos || v > end) return "";
  v += 12;
  return dom.substr(v, dom.find('"', v) - v);
}

}  // namespace shoal::testkit
