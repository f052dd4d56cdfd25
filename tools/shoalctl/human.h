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

}  // namespace shoal::ctl
