#pragma once
// A small disk for tests that fill one: a tmpfs of a few MiB mounted on a fresh directory, so
// that writes fail with ENOSPC ("No space left on device") at a known size. Mounting needs root;
// tests skip with a MESSAGE when mounted() is false.

#include <string>

#include "tests/support/process.h"

namespace shoal::testkit {

class SmallDisk {
 public:
  // Mounts a tmpfs of `mib` MiB on dir/name (created). mounted() says whether it worked.
  SmallDisk(const TempDir& dir, const std::string& name, int mib);
  ~SmallDisk();  // unmounts (lazily: files still open do not keep it mounted)
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

  bool mounted() const { return mounted_; }
  // The mount point.
  const std::string& path() const { return path_; }
  // Changes the size of the mounted file system (a disk that grew). Returns whether it worked.
  bool Resize(int mib);

 private:
  std::string path_;
  bool mounted_ = false;
};

}  // namespace shoal::testkit
