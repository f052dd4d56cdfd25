#include "agent/agent.h"

#include <utility>

#include <fstream>
#include <thread>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "agent/pull_through.h"
#include "lib/core/log.h"
#include "lib/store/blob_store.h"
#include "lib/upstream/credentials.h"
#include "lib/upstream/registry_client.h"
#include "registry-shim/metrics.h"
#include "registry-shim/server.h"

namespace shoal::agent {
namespace asio = boost::asio;

namespace {

Result<std::map<std::string, upstream::RegistryEndpoint>> ParseUpstreams(
    const std::vector<std::string>& specs) {
  std::map<std::string, upstream::RegistryEndpoint> out;
  for (const auto& spec : specs) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "--upstream \"" + spec + "\" must be REGISTRY=URL");
    }
    auto url = http::Url::Parse(spec.substr(eq + 1));
    if (!url) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "--upstream \"" + spec + "\": " + url.error().message);
    }
    std::string registry = spec.substr(0, eq);
    out[registry] = upstream::RegistryEndpoint{registry, url.value()};
  }
  return out;
}

Result<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return MakeError(ErrorCode::kInvalidArgument, "--listen \"" + listen + "\" must be HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  try {
    int port = std::stoi(listen.substr(colon + 1));
    if (port < 0 || port > 65535) throw std::out_of_range("port");
    return std::make_pair(host, static_cast<uint16_t>(port));
  } catch (const std::exception&) {
    return MakeError(ErrorCode::kInvalidArgument, "--listen \"" + listen + "\" has a bad port");
  }
}

}  // namespace

int RunAgent(const AgentConfig& config) {
  InitLogging(config.log_format, config.log_level, "shoal-agent");
  auto fail = [](const Error& e) {
    spdlog::critical("startup failed: {}", e.ToString());
    return 1;
  };

  auto store = store::BlobStore::Open(config.cache_dir);
  if (!store) return fail(store.error());
  if (store.value()->cleaned_temp_files() > 0) {
    spdlog::info("removed {} partial files left by an earlier run",
                 store.value()->cleaned_temp_files());
  }
  auto upstreams = ParseUpstreams(config.upstreams);
  if (!upstreams) return fail(upstreams.error());
  upstream::Credentials credentials;
  if (!config.credentials_file.empty()) {
    auto loaded = upstream::Credentials::LoadDockerConfig(config.credentials_file);
    if (!loaded) return fail(loaded.error());
    credentials = std::move(loaded.value());
  }
  auto listen = SplitHostPort(config.listen);
  if (!listen) return fail(listen.error());

  asio::io_context ioc(1);
  // Hashing, fsync and other blocking work; never on the network thread.
  asio::thread_pool pool(2);
  prometheus::Registry registry;

  upstream::ClientOptions client_options;
  client_options.ca_file = config.ca_file;
  upstream::RegistryClient client(ioc.get_executor(), client_options, std::move(credentials));

  PullThroughOptions options;
  options.upstreams = std::move(upstreams.value());
  options.allow_unmapped_registries = !config.strict_upstreams;
  options.tag_ttl = std::chrono::seconds(config.tag_ttl_s);
  options.fetch.part_size = config.part_size_mib << 20;
  options.fetch.streams = config.range_streams;
  PullThrough backend(ioc, pool, *store.value(), client, std::move(options), registry);

  shim::Metrics shim_metrics = shim::Metrics::Create(registry);
  shim::ServerOptions server_options;
  server_options.default_registry = config.default_registry;
  shim::Server server(ioc, backend, shim_metrics, server_options);
  server.SetMetricsHandler(
      [&registry] { return prometheus::TextSerializer().Serialize(registry.Collect()); });
  auto port = server.Listen(listen.value().first, listen.value().second);
  if (!port) return fail(port.error());
  if (!config.port_file.empty()) {
    std::string tmp = config.port_file + ".tmp";
    std::ofstream(tmp) << port.value() << "\n";
    std::rename(tmp.c_str(), config.port_file.c_str());
  }
  server.Start();
  spdlog::info("registry shim listening on {}:{}, cache {}", listen.value().first, port.value(),
               config.cache_dir);

  // Graceful shutdown: stop accepting, give open responses a bounded time, then stop.
  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  asio::steady_timer drain(ioc);
  std::function<void()> drain_check;
  auto deadline = std::chrono::steady_clock::time_point::max();
  drain_check = [&] {
    if (server.active_connections() == 0 || std::chrono::steady_clock::now() >= deadline) {
      ioc.stop();
      return;
    }
    drain.expires_after(std::chrono::milliseconds(100));
    drain.async_wait([&](boost::system::error_code) { drain_check(); });
  };
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", sig);
    server.Stop();
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    drain_check();
  });
  ioc.run();
  pool.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace shoal::agent
