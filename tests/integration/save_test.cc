// `shoalctl save`: images from a real agent (upstream: Debian's docker-registry) written as a
// docker-archive that Debian's real dockerd loads, and a failed save that leaves no file.
#include <doctest/doctest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/support/agent.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace fs = std::filesystem;
namespace {

// A registry standing for docker.io and gcr.io, and one agent in front of it.
struct SaveWorld {
  TempDir dir{"shoal-save"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<Agent> agent;

  SaveWorld() {
    auto reg = Registry::Start();
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.upstreams = {"docker.io=" + registry->Url(), "gcr.io=" + registry->Url()};
    opts.extra_args = {"--unmapped", "error"};
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
  }

  BuiltImage Push(const ImageSpec& spec, const std::string& name, const std::string& tag,
                  const std::string& layout_name) {
    std::string layout = dir.Sub(layout_name);
    auto built = BuildImage(spec, layout, tag);
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    auto pushed = PushImage(*registry, layout, tag, name);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return built.value();
  }
};

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

TEST_CASE("save: docker load reads the archive with the right config digests and RepoTags") {
  SaveWorld w;
  // Layers in every compression: the archive must hold them as plain tar.
  ImageSpec app;
  app.layers.push_back(LayerSpec{Compression::kGzip, 10, {1ull << 20}, 501});
  app.layers.push_back(LayerSpec{Compression::kZstd, 6, {}, 502});
  app.layers.push_back(LayerSpec{Compression::kNone, 4, {}, 503});
  BuiltImage gcr = w.Push(app, "proj/app", "1", "layout-app");
  ImageSpec hello;
  hello.layers.push_back(LayerSpec{Compression::kGzip, 5, {}, 601});
  BuiltImage hub = w.Push(hello, "library/hello", "2", "layout-hello");

  const std::string out = w.dir.Sub("images.tar");
  auto saved = Shoalctl({"save", "gcr.io/proj/app:1", "hello:2", "-o", out, "--agent",
                         w.agent->Url(), "--json"});
  REQUIRE_MESSAGE(saved.has_value(), (Why(saved) + "\n" + w.agent->LogTail()));
  auto report = nlohmann::json::parse(saved.value(), nullptr, false);
  REQUIRE_MESSAGE(!report.is_discarded(), saved.value());
  CHECK(report["ok"] == true);
  CHECK(report["images"].size() == 2);
  CHECK(report["images"][0]["config"] == gcr.config_digest.str());
  REQUIRE(fs::exists(out));

  auto dockerd = Dockerd::Start();
  REQUIRE_MESSAGE(dockerd.has_value(), Why(dockerd));
  Dockerd& d = *dockerd.value();
  auto loaded = d.Docker({"load", "-i", out});
  REQUIRE_MESSAGE(loaded.has_value(), (Why(loaded) + "\n" + d.LogTail()));
  CHECK(loaded.value().find("Loaded image: gcr.io/proj/app:1") != std::string::npos);
  CHECK(loaded.value().find("Loaded image: hello:2") != std::string::npos);

  auto id = d.Docker({"image", "inspect", "--format", "{{.Id}}", "gcr.io/proj/app:1"});
  REQUIRE_MESSAGE(id.has_value(), Why(id));
  CHECK(Trim(id.value()) == gcr.config_digest.str());
  auto hub_id = d.Docker({"image", "inspect", "--format", "{{.Id}}", "hello:2"});
  REQUIRE_MESSAGE(hub_id.has_value(), Why(hub_id));
  CHECK(Trim(hub_id.value()) == hub.config_digest.str());

  auto tags = d.Docker({"image", "inspect", "--format", "{{json .RepoTags}}", gcr.config_digest.str()});
  REQUIRE(tags.has_value());
  CHECK(Trim(tags.value()) == R"(["gcr.io/proj/app:1"])");
  // The layers docker stored are the uncompressed tars the config names.
  auto layers = d.Docker({"image", "inspect", "--format", "{{json .RootFS.Layers}}", "gcr.io/proj/app:1"});
  REQUIRE(layers.has_value());
  auto layer_ids = nlohmann::json::parse(Trim(layers.value()), nullptr, false);
  REQUIRE(layer_ids.is_array());
  REQUIRE(layer_ids.size() == gcr.diff_ids.size());
  for (size_t i = 0; i < gcr.diff_ids.size(); ++i) CHECK(layer_ids[i] == gcr.diff_ids[i].str());
}

TEST_CASE("save: a failed save (unknown image) leaves no archive and no temp file") {
  SaveWorld w;
  ImageSpec app;
  app.layers.push_back(LayerSpec{Compression::kGzip, 5, {}, 701});
  w.Push(app, "proj/ok", "1", "layout-ok");
  const std::string out_dir = w.dir.Sub("out");
  fs::create_directories(out_dir);
  const std::string out = out_dir + "/images.tar";
  // The first image is fine and already written into the temp file when the second fails.
  auto saved = Shoalctl({"save", "gcr.io/proj/ok:1", "gcr.io/proj/missing:1", "-o", out,
                         "--agent", w.agent->Url()});
  REQUIRE_FALSE(saved.has_value());
  CHECK(saved.error().message.find("missing") != std::string::npos);
  CHECK_FALSE(fs::exists(out));
  CHECK(fs::is_empty(out_dir));
  // An unreachable agent fails too, with nothing written.
  auto unreachable =
      Shoalctl({"save", "gcr.io/proj/ok:1", "-o", out, "--agent", "http://127.0.0.1:1"});
  CHECK_FALSE(unreachable.has_value());
  CHECK(fs::is_empty(out_dir));
}

}  // namespace shoal::testkit
