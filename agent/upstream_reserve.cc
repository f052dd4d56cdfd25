#include "agent/upstream_reserve.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

namespace shoal::agent {

UpstreamReserve::UpstreamReserve(int64_t cap_bytes_per_s, std::function<void(int64_t)> apply)
    : state_(std::make_shared<State>()) {
  state_->cap = cap_bytes_per_s;
  state_->apply = std::move(apply);
}

UpstreamReserve::~UpstreamReserve() { state_->apply = nullptr; }

UpstreamReserve::Hold UpstreamReserve::Acquire() {
  if (state_->cap <= 0) return Hold();
  if (state_->holds++ == 0 && state_->apply) state_->apply(state_->cap);
  return Hold(state_);
}

UpstreamReserve::Hold& UpstreamReserve::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    Release();
    state_ = std::move(o.state_);
  }
  return *this;
}

void UpstreamReserve::Hold::Release() {
  if (!state_) return;
  std::shared_ptr<State> s = std::move(state_);
  if (--s->holds == 0 && s->apply) s->apply(0);
}

Result<std::string> DefaultRouteInterface(const std::string& route_table) {
  // Iface Destination Gateway Flags RefCnt Use Metric Mask ...; the default route has
  // destination and mask 00000000.
  std::istringstream in(route_table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string iface, dest, gateway, flags, refcnt, use, metric, mask;
    if (!(fields >> iface >> dest >> gateway >> flags >> refcnt >> use >> metric >> mask)) continue;
    if (dest == "00000000" && mask == "00000000") return iface;
  }
  return MakeError(ErrorCode::kNotFound, "no IPv4 default route");
}

Result<int64_t> LinkMbit(const std::string& sys_class_net, const std::string& iface) {
  if (iface.empty() || iface.find('/') != std::string::npos || iface == "." || iface == "..") {
    return MakeError(ErrorCode::kInvalidArgument, "bad interface name '" + iface + "'");
  }
  const std::string path = sys_class_net + "/" + iface + "/speed";
  std::ifstream f(path);
  long long mbit = 0;
  // Reading fails (EINVAL) for a link that is down or has no speed, as for many virtual ones.
  if (!f || !(f >> mbit)) return MakeError(ErrorCode::kNotFound, path + ": no link speed");
  if (mbit <= 0) {
    return MakeError(ErrorCode::kNotFound,
                     path + ": the driver reports no speed (" + std::to_string(mbit) + ")");
  }
  return static_cast<int64_t>(mbit);
}

Result<int64_t> DefaultRouteLinkMbit() {
  std::ifstream f("/proc/net/route");
  if (!f) return MakeError(ErrorCode::kNotFound, "/proc/net/route: cannot read it");
  std::stringstream table;
  table << f.rdbuf();
  auto iface = DefaultRouteInterface(table.str());
  if (!iface) return iface.error();
  return LinkMbit("/sys/class/net", iface.value());
}

}  // namespace shoal::agent
