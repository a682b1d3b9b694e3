// A child process driven over pipes: lines out on its stdin, lines back from
// its stdout, the tail of its stderr kept for error messages. Used by the
// "command" reward. The child runs in its own process group (a Ctrl-C at the
// terminal reaches only the trainer, which then ends the child) with default
// signal dispositions; writes never raise SIGPIPE in this process.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "core/status.h"

namespace grpo {

class LineProcess {
 public:
  LineProcess() = default;
  ~LineProcess() { stop(); }
  LineProcess(const LineProcess&) = delete;
  LineProcess& operator=(const LineProcess&) = delete;

  // argv[0] is searched in PATH. Errors name the command and errno's reason.
  Status start(const std::vector<std::string>& argv);
  bool running() const { return pid_ > 0; }
  // Reaps the child if it has ended since the last call; returns running().
  bool check_alive();

  enum class Event { line, timeout, exited };
  // Writes as much of *out as the pipe accepts (erasing what was written) and
  // waits up to timeout_s for one complete stdout line (returned without its
  // newline). `exited`: the child closed stdout or its stdin, or died; it has
  // been reaped and exit_reason() says how it ended.
  Event pump(std::string* out, double timeout_s, std::string* line);

  // "exited with status 3", "killed by signal 9 (Killed)", ...
  const std::string& exit_reason() const { return exit_reason_; }
  // The last lines the child wrote to stderr (at most ~20 lines / 4 KiB).
  std::string stderr_tail() const;
  // Closes stdin, gives the child grace_s to exit, then kills its process
  // group and reaps it. Safe to call when not running.
  void stop(double grace_s = 0.5);

 private:
  void drain_stderr();
  void reap(double grace_s);
  void close_fds();

  pid_t pid_ = -1;
  int in_fd_ = -1, out_fd_ = -1, err_fd_ = -1;
  std::string out_buf_, err_tail_, exit_reason_;
};

}  // namespace grpo
