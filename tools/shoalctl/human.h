#pragma once
// Formatting shared by shoalctl's commands.

#include <cstdio>
#include <string>

namespace shoal::ctl {

// bytes as "12.3 MiB" (B, KiB, MiB, GiB or TiB, one decimal).
inline std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", bytes, units[u]);
  return buf;
}

// seconds as "42s", "3m07s" or "2h05m"; "-" when negative or not finite.
inline std::string HumanDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) return "-";
  long long s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  }
  return buf;
}

}  // namespace shoal::ctl
