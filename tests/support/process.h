#pragma once
// Real child processes for integration tests: temp dirs, spawning daemons in their own process
// group, waiting for them to serve HTTP, and running commands to completion.
//
// Every child started here (Process or RunCommand) is also registered with a watchdog process,
// so that if the test binary dies in any way (assertion abort, crash, SIGKILL, Ctrl-C) the
// children's whole process groups are SIGKILLed and no daemon outlives the test run.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/error.h"

namespace shoal::testkit {

// A fresh directory (mkdtemp under $TMPDIR, else /tmp), removed recursively by the destructor
// unless the environment has SHOAL_KEEP_TMP=1 (then its path is logged instead). Not copyable.
class TempDir {
 public:
  // Creates "<tmp>/<prefix>-XXXXXX". Throws std::runtime_error if mkdtemp fails (doctest
  // reports it as a test failure).
  explicit TempDir(const std::string& prefix = "shoal-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Absolute path without a trailing slash.
  const std::string& path() const { return path_; }
  // path() + "/" + name; creates nothing.
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A child process started with posix_spawnp in its own process group, stdout and stderr
// appended to a log file. Not copyable; the destructor calls Stop(). Methods are not
// thread-safe (use one Process from one thread at a time).
class Process {
 public:
  // Starts argv[0] (searched in PATH) with the current environment plus extra_env
  // ("NAME=value" entries override inherited ones). Errors: kUnavailable if spawning fails
  // (e.g. the executable does not exist), naming argv[0].
  static Result<std::unique_ptr<Process>> Start(std::vector<std::string> argv, std::string log_path,
                                                std::vector<std::string> extra_env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // The child's pid (also its process group id).
  pid_t pid() const { return pid_; }
  // True while the child has not exited. Reaps it when it has.
  bool Running();
  // SIGTERM to the process group, waits up to `grace` (at least 30 s in an ASan build, where
  // LeakSanitizer's exit scan can be slow; a wait past `grace` is logged), then SIGKILL to the
  // group. Returns the exit status: the exit code if the child exited, 128 + signal number if a
  // signal killed it. Idempotent: later calls return the same status.
  int Stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  // SIGKILL to the whole group now and reap (simulates a crash). Idempotent.
  void Kill();
  // Sends `sig` (e.g. SIGHUP, SIGSTOP, SIGCONT) to the child only. No-op once it has exited.
  void Signal(int sig);
  // Path of the stdout+stderr log.
  const std::string& log_path() const { return log_path_; }
  // Current contents of the log (handy in failure messages).
  std::string Log() const;
  // The last `max_bytes` of the log.
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  Process(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  void Reap(int wait_status);

  pid_t pid_;
  std::string log_path_;
  bool exited_ = false;
  int exit_status_ = 0;
};

// SIGKILLs the process group of every child started by Process or RunCommand that has not been
// reaped yet. For interrupt handling in programs (e.g. a thread doing sigwait for SIGINT before
// exiting); tests never need it, the watchdog covers crashes. Thread-safe; not async-signal-safe.
void KillAllChildren();

// For programs (benchmarks): SIGINT, SIGTERM and SIGHUP go to a thread of their own, blocked in
// every other thread (children get a clean mask from posix_spawn), their default disposition
// restored first (a shell starts background jobs with SIGINT ignored, and an ignored signal
// never reaches sigwait). That thread calls on_signal(sig) once, which cleans up and exits.
// Call first thing in main, before any other thread starts.
void HandleInterruptsOnThread(std::function<void(int)> on_signal);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close). Another
// process may grab it before you bind; prefer letting servers bind port 0 where they can.
uint16_t FreePort();

// Polls `url` (http:// only) every ~20 ms until any HTTP response arrives (any status) or the
// timeout passes. Returns whether a response arrived.
bool WaitForHttp(const std::string& url, std::chrono::milliseconds timeout);

// Polls `condition` every `interval` until it returns true or `timeout` passes. Returns its last
// value. Use instead of fixed sleeps.
bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
               std::chrono::milliseconds interval = std::chrono::milliseconds(20));

// Runs argv (argv[0] searched in PATH) to completion with stdin from /dev/null and returns its
// combined stdout+stderr. Errors: kUnavailable on spawn failure, non-zero exit or timeout (the
// process group is then killed); the message holds the command line, the status and the last
// 4 KiB of output.
Result<std::string> RunCommand(std::vector<std::string> argv,
                               std::chrono::seconds timeout = std::chrono::seconds(300),
                               std::vector<std::string> extra_env = {});

// Whole file contents; "" if the file cannot be read.
std::string ReadFile(const std::string& path);
// Creates or truncates `path` with `content`. Throws std::runtime_error naming the path on
// failure.
void WriteFile(const std::string& path, const std::string& content);

}  // namespace shoal::testkit
