#pragma once
// CPU and memory figures of processes and of the whole machine, read from /proc, for the
// benchmarks' side-by-side reports. Linux only; every reader returns 0 when the file is gone.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::testkit {

// Fields of /proc/PID/stat after the command name: [0] is field 3 (state). Empty if pid is gone.
std::vector<std::string> StatFields(pid_t pid);
// utime + stime of one process (all its threads), in seconds.
double ProcessCpuSeconds(pid_t pid);
// CPU seconds of pid plus its direct children (e.g. nginx's master and workers).
double TreeCpuSeconds(pid_t pid);
// A "Vm...:  N kB" line of /proc/PID/status (key "VmHWM", "VmRSS"...) in bytes.
uint64_t StatusBytes(pid_t pid, const std::string& key);
// Seconds pid's threads spent runnable but waiting for a CPU (schedstat run_delay), summed over
// its current threads.
double RunDelaySeconds(pid_t pid);
// CPU seconds of this process plus its reaped children.
double SelfAndChildrenCpuSeconds();
// CPU pressure stall (/proc/pressure/cpu "some ... total=") in seconds; 0 without PSI.
double CpuPressureSeconds();

// Whole-machine CPU ticks from the first line of /proc/stat (busy: all but idle and iowait;
// guest time is already in user).
struct SystemTicks {
  uint64_t total = 0, busy = 0, softirq = 0, steal = 0, iowait = 0;
};
SystemTicks ReadSystemTicks();
// Clock ticks (sysconf(_SC_CLK_TCK)) in seconds.
double TicksToSeconds(uint64_t ticks);

// "<cores> x <CPU model>, <RAM> MiB RAM": the machine line benchmarks print first.
std::string MachineSummary();
// The first three fields of /proc/loadavg ("0.52 0.61 0.70").
std::string LoadAverage();

}  // namespace shoal::testkit
