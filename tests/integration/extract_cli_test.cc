// `shoalctl extract` end to end: a real docker-registry, a real agent, the real shoalctl binary.
#include <doctest/doctest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "lib/extract/image.h"
#include "tests/support/agent.h"
#include "tests/support/image.h"
#include "tests/support/layer_tar.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/why.h"

namespace shoal::testkit {

TEST_CASE("extract cli: shoalctl extract pulls through the agent into an overlay2 tree") {
  TempDir dir("shoal-extract-cli");
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = 60, .big_files = {6 << 20}, .seed = 31},
      LayerSpec{.compression = Compression::kZstd, .small_files = 40, .seed = 32, .with_whiteout = true},
      LayerSpec{.compression = Compression::kNone, .small_files = 10, .seed = 33},
  };
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE_MESSAGE(img.has_value(), Why(img));
  auto pushed = PushImage(*reg.value(), dir.Sub("layout"), "1", "demo/app");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {"docker.io=" + reg.value()->Url()};
  auto agent = Agent::Start(opts);
  REQUIRE_MESSAGE(agent.has_value(), Why(agent));

  const std::string root = dir.Sub("root");
  auto out = RunCommand({SHOAL_CTL_BIN, "extract", "--agent", agent.value()->Url(), "--json",
                         "demo/app:1", root});
  REQUIRE_MESSAGE(out.has_value(), (Why(out) + "\n" + agent.value()->LogTail()));
  auto json = nlohmann::json::parse(out.value().substr(out.value().find('{')));
  CHECK(json["ok"] == true);
  CHECK(json["digest"] == img.value().manifest_digest.str());
  REQUIRE(json["layers"].size() == 3);
  std::vector<Tree> trees;
  for (size_t i = 0; i < 3; ++i) {
    const auto& l = json["layers"][i];
    CHECK(l["digest"] == img.value().layer_digests[i].str());
    CHECK(l["reused"] == false);
    trees.push_back(SnapshotTree(l["diff"].get<std::string>()));
  }
  CHECK(json["layers"][0]["compression"] == "gzip");
  CHECK(json["layers"][1]["compression"] == "zstd");
  CHECK(json["layers"][2]["compression"] == "tar");
  CHECK(trees[0].at("big/blob-31-0.bin").size == 6u << 20);
  CHECK(trees[1].at("opaque").xattrs.at("trusted.overlay.opaque") == "y");
  CHECK(trees[1].at("removed-32").type == 'c');
  // Only the overlay2 tree is left: no download temp files.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    names.push_back(e.path().filename().string());
  }
  CHECK(names.size() == 4);  // l + 3 layers
  for (const auto& n : names) CHECK(n.find("shoalctl-download") == std::string::npos);

  // The same trees as extracting the layout's blob files directly (no agent, no streaming).
  std::vector<extract::LayerInput> inputs;
  for (size_t i = 0; i < 3; ++i) {
    std::string path = dir.Sub("layout/blobs/sha256/") + img.value().layer_digests[i].hex();
    inputs.push_back({.digest = img.value().layer_digests[i],
                      .size_hint = 0,
                      .open = [path] { return extract::OpenFileSource(path); },
                      .verify = true});
  }
  auto direct = extract::ExtractImage(dir.Sub("direct"), inputs);
  REQUIRE_MESSAGE(direct.has_value(), Why(direct));
  for (size_t i = 0; i < 3; ++i) {
    CHECK(DiffTrees(SnapshotTree(direct.value()[i].diff_dir), trees[i]) ==
          std::vector<std::string>{});
  }

  // A second run reuses every layer; an unknown image fails with exit status 1.
  auto again = RunCommand({SHOAL_CTL_BIN, "extract", "--agent", agent.value()->Url(), "--json",
                           "demo/app:1", root});
  REQUIRE(again.has_value());
  auto j2 = nlohmann::json::parse(again.value().substr(again.value().find('{')));
  for (const auto& l : j2["layers"]) CHECK(l["reused"] == true);
  auto missing = RunCommand({SHOAL_CTL_BIN, "extract", "--agent", agent.value()->Url(),
                             "demo/none:1", dir.Sub("root2")});
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message.find("exit") != std::string::npos);
  CHECK(missing.error().message.find("shoalctl extract demo/none:1: not_found") !=
        std::string::npos);
}

}  // namespace shoal::testkit
