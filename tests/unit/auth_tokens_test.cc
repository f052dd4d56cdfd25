// lib/auth: token files (format, errors that never show the token), the announce key, and
// rotation by rewriting the file (a client's token and a server's set follow the file).

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "lib/auth/tokens.h"

namespace shoal::auth {
namespace {

const std::string kA = "aaaaaaaaaaaaaaaa-first-token";
const std::string kB = "bbbbbbbbbbbbbbbb-second-token";

struct Dir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("shoal-auth-" + std::to_string(::getpid()));
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() { std::filesystem::remove_all(path); }
  // Writes a file the way a Secret volume changes: a new file renamed over the old one.
  std::string Write(const std::string& name, const std::string& text) const {
    std::string final_path = (path / name).string();
    std::string tmp = final_path + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, final_path);
    return final_path;
  }
};

}  // namespace

TEST_CASE("auth tokens: a token file lists tokens, comments and blank lines are skipped") {
  Dir d;
  auto tokens = ReadTokens(d.Write("t", "# agents\n\n  " + kA + "  \r\n" + kB + "\n"));
  REQUIRE(tokens.has_value());
  REQUIRE(tokens.value().size() == 2);
  CHECK(tokens.value()[0] == kA);
  CHECK(tokens.value()[1] == kB);
}

TEST_CASE("auth tokens: bad token files get errors naming the file and line, never the token") {
  Dir d;
  auto missing = ReadTokens((d.path / "absent").string());
  CHECK(missing.error().code == ErrorCode::kIo);
  auto empty = ReadTokens(d.Write("e", "# nothing\n\n"));
  CHECK(empty.error().message.find("holds no token") != std::string::npos);
  auto shorty = ReadTokens(d.Write("s", "# x\nshort-secret\n"));
  CHECK(shorty.error().code == ErrorCode::kInvalidArgument);
  CHECK(shorty.error().message.find("line 2") != std::string::npos);
  CHECK(shorty.error().message.find("short-secret") == std::string::npos);
  auto spaced = ReadTokens(d.Write("sp", "two words secret token\n"));
  CHECK(spaced.error().message.find("without spaces") != std::string::npos);
  CHECK(spaced.error().message.find("secret") == std::string::npos);
}

TEST_CASE("auth tokens: the announce key is stable, per token, and not the token") {
  CHECK(AnnounceKey(kA) == AnnounceKey(kA));
  CHECK(AnnounceKey(kA) != AnnounceKey(kB));
  CHECK(AnnounceKey(kA).size() == 32);
  CHECK(AnnounceKey(kA).find(kA) == std::string::npos);
}

TEST_CASE("auth tokens: a server's set accepts its tokens only, and follows its file") {
  Dir d;
  std::string path = d.Write("set", kA + "\n");
  auto set = TokenSet::Load(path);
  REQUIRE(set.has_value());
  CHECK(set.value().Accepts(kA));
  CHECK_FALSE(set.value().Accepts(kB));
  CHECK_FALSE(set.value().Accepts(""));
  CHECK_FALSE(set.value().Accepts(kA.substr(0, kA.size() - 1)));
  CHECK(set.value().AcceptsAnnounceKey(AnnounceKey(kA)));
  CHECK_FALSE(set.value().AcceptsAnnounceKey(AnnounceKey(kB)));
  CHECK_FALSE(set.value().AcceptsAnnounceKey(kA));
  // Rotation: the new token is added, clients move, the old one is dropped.
  d.Write("set", kA + "\n" + kB + "\n");
  CHECK(set.value().Reload());
  CHECK(set.value().Accepts(kA));
  CHECK(set.value().Accepts(kB));
  d.Write("set", kB + "\n");
  CHECK(set.value().Reload());
  CHECK_FALSE(set.value().Accepts(kA));
  CHECK(set.value().Accepts(kB));
  // A broken file keeps the last good set rather than locking every agent out.
  d.Write("set", "# emptied by mistake\n");
  CHECK_FALSE(set.value().Reload());
  CHECK(set.value().Accepts(kB));
  CHECK(set.value().size() == 1);
}

TEST_CASE("auth tokens: a client's token follows its file, a broken file keeps the last one") {
  Dir d;
  std::string path = d.Write("mine", kA + "\n");
  auto token = ClientToken::Open(path);
  REQUIRE(token.has_value());
  CHECK(token.value().Current() == kA);
  CHECK(token.value().generation() == 0);
  d.Write("mine", kB + "\n");
  CHECK(token.value().Current(std::chrono::milliseconds(0)) == kB);
  CHECK(token.value().generation() == 1);
  d.Write("mine", "\n");
  CHECK(token.value().Current(std::chrono::milliseconds(0)) == kB);
  CHECK(token.value().generation() == 1);
}

}  // namespace shoal::auth
