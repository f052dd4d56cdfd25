#include "tools/shoalctl/progress_view.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

#include "tools/shoalctl/human.h"

namespace shoal::ctl {

namespace {

constexpr int kBarWidth = 24;
constexpr size_t kMaxTtyRows = 40;  // beyond, the rest is summarised in one line

std::string Bar(uint64_t done, uint64_t total) {
  int filled = total == 0 ? 0 : static_cast<int>(static_cast<double>(done) / total * kBarWidth);
  filled = std::clamp(filled, 0, kBarWidth);
  return "[" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "]";
}

}  // namespace

ProgressView::ProgressView(bool tty, std::FILE* out)
    : tty_(tty), out_(out), last_summary_(std::chrono::steady_clock::now()) {}

namespace {
// "1.2 GiB" for bytes, "3 layers" for a row that counts items.
std::string Amount(const ProgressRow& row, uint64_t n) {
  return row.unit.empty() ? Human(static_cast<double>(n)) : std::to_string(n) + " " + row.unit;
}
}  // namespace

std::string ProgressView::Line(const ProgressRow& row, std::chrono::steady_clock::time_point now) {
  if (!row.unit.empty()) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%-28.28s %s %10s / %-10s %-8s", row.name.c_str(),
                  Bar(row.done, row.total).c_str(), std::to_string(row.done).c_str(),
                  Amount(row, row.total).c_str(), row.state.c_str());
    std::string line = buf;
    if (!row.error.empty()) line += "  " + row.error.substr(0, 120);
    return line;
  }
  auto it = rates_.find(row.name);
  if (it == rates_.end() && row.done > 0 && !row.Ended()) {
    it = rates_.emplace(row.name, Rate{now, row.done}).first;
  }
  std::string rate = "", eta = "";
  if (it != rates_.end() && !row.Ended()) {
    double secs = std::chrono::duration<double>(now - it->second.first).count();
    if (secs > 0.5 && row.done > it->second.first_bytes) {
      double bps = static_cast<double>(row.done - it->second.first_bytes) / secs;
      rate = Human(bps) + "/s";
      if (row.total > row.done)
        eta = "ETA " + HumanDuration(static_cast<double>(row.total - row.done) / bps);
    }
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%-28.28s %s %10s / %-10s %-8s %12s %s", row.name.c_str(),
                Bar(row.done, row.total).c_str(), Human(static_cast<double>(row.done)).c_str(),
                Human(static_cast<double>(row.total)).c_str(), row.state.c_str(), rate.c_str(),
                eta.c_str());
  std::string line = buf;
  if (!row.error.empty()) line += "  " + row.error.substr(0, 120);
  return line;
}

void ProgressView::Update(const std::string& title, const std::vector<ProgressRow>& rows) {
  auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(200)) return;
    last_draw_ = now;
    Clear();
    // Lines are cut to the terminal's width: a wrapped line would break the redraw in place.
    size_t width = 200;
    winsize ws{};
    if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1) width = ws.ws_col - 1;
    std::fprintf(out_, "%s\n", title.substr(0, width).c_str());
    int lines = 1;
    for (size_t i = 0; i < rows.size() && i < kMaxTtyRows; ++i) {
      std::fprintf(out_, "%s\n", Line(rows[i], now).substr(0, width).c_str());
      ++lines;
    }
    if (rows.size() > kMaxTtyRows) {
      size_t ended = std::count_if(rows.begin() + kMaxTtyRows, rows.end(),
                                   [](const ProgressRow& r) { return r.Ended(); });
      std::fprintf(out_, "... and %zu more (%zu ended)\n", rows.size() - kMaxTtyRows, ended);
      ++lines;
    }
    drawn_lines_ = lines;
    std::fflush(out_);
    return;
  }
  // Plain: one line when a row ends, and a summary every 10 s.
  for (const auto& row : rows) {
    std::string& printed = printed_state_[row.name];
    if (row.Ended() && printed != row.state) {
      std::fprintf(out_, "%s %s %s%s\n", row.name.c_str(), row.state.c_str(),
                   Amount(row, row.done).c_str(),
                   row.error.empty() ? "" : ("  " + row.error).c_str());
    }
    printed = row.state;
  }
  if (now - last_summary_ >= std::chrono::seconds(10)) {
    last_summary_ = now;
    uint64_t done = 0, total = 0;
    size_t ended = 0;
    for (const auto& r : rows) {
      if (r.unit.empty()) {
        done += r.done;
        total += r.total;
      }
      ended += r.Ended();
    }
    std::fprintf(out_, "%s: %zu/%zu ended, %s / %s\n", title.c_str(), ended, rows.size(),
                 Human(static_cast<double>(done)).c_str(),
                 Human(static_cast<double>(total)).c_str());
  }
  std::fflush(out_);
}

void ProgressView::Clear() {
  if (!tty_) return;
  for (int i = 0; i < drawn_lines_; ++i) std::fprintf(out_, "\033[A\r\033[K");
  drawn_lines_ = 0;
  std::fflush(out_);
}

void PrintResultTable(const std::string& what, const std::vector<ProgressRow>& rows) {
  std::printf("%-28s %-8s %10s %8s  %s\n", what.c_str(), "RESULT", "BYTES", "TIME", "ERROR");
  for (const auto& r : rows) {
    std::string result = r.Ok() ? "ok" : r.state == "timeout" ? "timeout" : "failed";
    std::printf("%-28s %-8s %10s %8s  %s\n", r.name.c_str(), result.c_str(),
                Amount(r, r.done).c_str(), HumanDuration(r.seconds).c_str(), r.error.c_str());
  }
}

}  // namespace shoal::ctl
