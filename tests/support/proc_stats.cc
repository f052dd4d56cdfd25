#include "tests/support/proc_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/process.h"

namespace shoal::testkit {

std::vector<std::string> StatFields(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  auto paren = stat.rfind(')');
  if (paren == std::string::npos) return {};
  std::istringstream in(stat.substr(paren + 1));
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  return fields;
}

double TicksToSeconds(uint64_t ticks) {
  return static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ProcessCpuSeconds(pid_t pid) {
  auto f = StatFields(pid);
  if (f.size() < 13) return 0;
  return TicksToSeconds(std::stoull(f[11]) + std::stoull(f[12]));
}

double TreeCpuSeconds(pid_t pid) {
  double total = ProcessCpuSeconds(pid);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = entry.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    pid_t child = static_cast<pid_t>(std::stol(name));
    auto f = StatFields(child);
    if (f.size() > 1 && f[1] == std::to_string(pid)) total += ProcessCpuSeconds(child);
  }
  return total;
}

uint64_t StatusBytes(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

double RunDelaySeconds(pid_t pid) {
  double total = 0;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::istringstream in(ReadFile(e.path().string() + "/schedstat"));
    uint64_t run = 0, wait = 0;
    if (in >> run >> wait) total += static_cast<double>(wait) / 1e9;
  }
  return total;
}

double SelfAndChildrenCpuSeconds() {
  auto seconds = [](const rusage& u) {
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  return seconds(self) + seconds(children);
}

double CpuPressureSeconds() {
  std::string text = ReadFile("/proc/pressure/cpu");
  auto pos = text.find("total=");
  if (text.rfind("some", 0) != 0 || pos == std::string::npos) return 0;
  return std::strtod(text.c_str() + pos + 6, nullptr) / 1e6;
}

SystemTicks ReadSystemTicks() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  SystemTicks t;
  uint64_t v;
  // user nice system idle iowait irq softirq steal guest guest_nice
  for (int i = 0; i < 8 && in >> v; ++i) {
    t.total += v;
    if (i != 3 && i != 4) t.busy += v;
    if (i == 4) t.iowait = v;
    if (i == 6) t.softirq = v;
    if (i == 7) t.steal = v;
  }
  return t;
}

std::string MachineSummary() {
  std::string model;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                 static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " x " + model + ", " +
         std::to_string(ram >> 20) + " MiB RAM";
}

std::string LoadAverage() {
  std::istringstream in(ReadFile("/proc/loadavg"));
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace shoal::testkit
