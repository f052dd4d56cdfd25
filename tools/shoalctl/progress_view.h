#pragma once
// shoalctl's live progress for work split into rows (the layers of a node prefetch, the nodes of
// a cluster prefetch): bars redrawn in place on a terminal, plain lines at a modest rate
// otherwise, and the final result table.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace shoal::ctl {

// One row of progress: a layer or a node.
struct ProgressRow {
  std::string name;
  std::string state;  // waiting, pending, fetching, running, done, failed, timeout
  uint64_t done = 0;  // bytes, or items when `unit` names them
  uint64_t total = 0;
  std::string unit;    // empty: bytes; else what done and total count ("layers")
  double seconds = 0;  // time spent, for the result table
  std::string error;
  // Whether the row ended (done, failed or timed out).
  bool Ended() const { return state == "done" || state == "failed" || state == "timeout"; }
  bool Ok() const { return state == "done"; }
};

// Not thread-safe. Writes to `out` (stderr by convention, so --json output stays clean).
class ProgressView {
 public:
  // tty: redraw bars in place (at most 5 times a second); else print a line per row that ends
  // and a summary every 10 s.
  ProgressView(bool tty, std::FILE* out);
  // Shows the rows under a title line.
  void Update(const std::string& title, const std::vector<ProgressRow>& rows);
  // Erases what a tty view drew (before the result table).
  void Clear();

 private:
  struct Rate {
    std::chrono::steady_clock::time_point first;
    uint64_t first_bytes = 0;
  };
  std::string Line(const ProgressRow& row, std::chrono::steady_clock::time_point now);

  bool tty_;
  std::FILE* out_;
  int drawn_lines_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
  std::chrono::steady_clock::time_point last_summary_;
  std::map<std::string, Rate> rates_;
  std::map<std::string, std::string> printed_state_;  // plain mode: last state printed per row
};

// Prints the result table (NAME, RESULT, BYTES, TIME, ERROR) to stdout, `what` naming the first
// column (NODE or LAYER).
void PrintResultTable(const std::string& what, const std::vector<ProgressRow>& rows);

}  // namespace shoal::ctl
