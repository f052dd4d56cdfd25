#include "tests/support/small_disk.h"

#include <sys/mount.h>

#include <filesystem>

namespace shoal::testkit {

SmallDisk::SmallDisk(const TempDir& dir, const std::string& name, int mib) : path_(dir.Sub(name)) {
  std::filesystem::create_directories(path_);
  std::string opts = "size=" + std::to_string(mib) + "m";
  mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
}

SmallDisk::~SmallDisk() {
  if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
}

bool SmallDisk::Resize(int mib) {
  std::string opts = "size=" + std::to_string(mib) + "m";
  return ::mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) == 0;
}

}  // namespace shoal::testkit
