#include <doctest/doctest.h>

#include "lib/extract/entry_path.h"

namespace shoal::extract {
namespace {

std::string Norm(std::string_view p) {
  auto r = NormalizeEntryPath(p);
  return r ? r.value() : "ERROR: " + r.error().message;
}

}  // namespace

TEST_CASE("extract path: normalizes the harmless forms tar writers produce") {
  CHECK(Norm("a/b/c") == "a/b/c");
  CHECK(Norm("./a/b") == "a/b");
  CHECK(Norm("a//b/./c/") == "a/b/c");
  CHECK(Norm("./") == "");
  CHECK(Norm(".") == "");
  CHECK(Norm("...") == "...");
  CHECK(Norm("a/..b/c..") == "a/..b/c..");
  CHECK(Norm(".wh..wh..opq") == ".wh..wh..opq");
}

TEST_CASE("extract path: refuses absolute paths, '..' components, NUL and empty paths") {
  CHECK(Norm("/etc/passwd") == "ERROR: absolute path");
  CHECK(Norm("//etc") == "ERROR: absolute path");
  CHECK(Norm("../x") == "ERROR: '..' component");
  CHECK(Norm("a/../../x") == "ERROR: '..' component");
  CHECK(Norm("a/..") == "ERROR: '..' component");
  CHECK(Norm("") == "ERROR: empty path");
  CHECK(Norm(std::string_view("a\0b", 3)) == "ERROR: NUL byte in path");
}

TEST_CASE("extract path: enforces the length and depth limits") {
  PathLimits limits;
  CHECK_FALSE(NormalizeEntryPath(std::string(4097, 'a'), limits).has_value());
  CHECK(NormalizeEntryPath(std::string(255, 'a'), limits).has_value());
  auto long_name = NormalizeEntryPath("d/" + std::string(256, 'a'), limits);
  REQUIRE_FALSE(long_name.has_value());
  CHECK(long_name.error().message == "path component longer than 255 bytes");
  std::string deep;
  for (int i = 0; i < 129; ++i) deep += "d/";
  auto too_deep = NormalizeEntryPath(deep, limits);
  REQUIRE_FALSE(too_deep.has_value());
  CHECK(too_deep.error().message == "path deeper than 128 components");
}

TEST_CASE("extract path: SplitParent splits at the last slash") {
  CHECK(SplitParent("a/b/c") == std::pair<std::string_view, std::string_view>("a/b", "c"));
  CHECK(SplitParent("c") == std::pair<std::string_view, std::string_view>("", "c"));
}

}  // namespace shoal::extract
