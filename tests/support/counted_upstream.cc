#include "tests/support/counted_upstream.h"

#include <utility>

namespace shoal::testkit {

Result<CountedUpstream> CountedUpstream::Start(RegistryOptions options) {
  auto reg = Registry::Start(std::move(options));
  if (!reg) return reg.error();
  auto proxy = CountingProxy::Start(reg.value()->HostPort());
  if (!proxy) return proxy.error();
  CountedUpstream up;
  up.registry = std::move(reg.value());
  up.proxy = std::move(proxy.value());
  return up;
}

}  // namespace shoal::testkit
