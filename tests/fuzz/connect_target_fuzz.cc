// Fuzzes ParseConnectTarget, which reads the target of every CONNECT the shim's HTTPS proxy
// mode receives. Accepted targets name a valid registry and parse again to the same host and
// port; refusals are kInvalidArgument with a printable message.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lib/oci/reference.h"
#include "registry-shim/connect_proxy.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto target = shim::ParseConnectTarget(text);
  if (!target) {
    FUZZ_CHECK(target.error().code == ErrorCode::kInvalidArgument);
    FUZZ_CHECK(!target.error().message.empty());
    FUZZ_CHECK(fuzz::IsPrintable(target.error().message));
    return 0;
  }
  const shim::ConnectTarget& t = target.value();
  FUZZ_CHECK(!t.host.empty());
  FUZZ_CHECK(t.port >= 1);
  FUZZ_CHECK(oci::ValidateRegistryHost(t.Registry()));
  const bool v6 = t.host.find(':') != std::string::npos;
  const std::string again = (v6 ? "[" + t.host + "]" : t.host) + ":" + std::to_string(t.port);
  auto reparsed = shim::ParseConnectTarget(again);
  FUZZ_CHECK(reparsed);
  FUZZ_CHECK(reparsed.value().host == t.host && reparsed.value().port == t.port);
  return 0;
}
