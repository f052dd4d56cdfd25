#pragma once
// A docker-registry with a CountingProxy in front of it: the upstream that most integration tests
// give their agents, so that they can count what crossed it.

#include <memory>

#include "lib/core/error.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/registry.h"

namespace shoal::testkit {

struct CountedUpstream {
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;  // in front of registry; agents use proxy->Url()

  // Starts the registry, then the proxy. Errors: as Registry::Start and CountingProxy::Start.
  static Result<CountedUpstream> Start(RegistryOptions options = {});
};

}  // namespace shoal::testkit
