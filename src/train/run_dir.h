// Guards of a `grpo train` run directory: an exclusive lock so that two runs
// never share one (interleaved metrics, mixed configs, deleted checkpoints),
// and, on resume, the comparison of the new config with the config.toml the
// directory was started with.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/run_config.h"

namespace grpo {

// An flock(2) on <dir>/.lock holding the owner's pid. The kernel drops the
// lock when the descriptor closes, so a killed run never leaves it stale;
// the file itself stays (unlinking it would let a third run lock a new inode
// while a second still waits on the old one).
class RunDirLock {
 public:
  // Creates `dir` if needed and takes the lock without waiting. Fails at once,
  // naming the holder's pid, when another process (or another open lock in
  // this process) holds it.
  static Result<RunDirLock> acquire(const std::string& dir);
  RunDirLock() = default;
  RunDirLock(RunDirLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&& o) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// "key: old -> new" for every setting that differs between two configs (reward
// functions as reward.<name>.<param>; a function present on one side only as
// reward.<name>: absent). Keys that cannot change what is trained are left
// out: run.output_dir, log.progress, log.level.
std::vector<std::string> run_config_diff(const RunConfig& old_cfg, const RunConfig& new_cfg);

// Resume check: compares `cfg` with <out_dir>/config.toml (nothing to do when
// that file is absent). Differences are an error listing them, unless
// `allow_changes`, when they are listed on `console` (may be null) and accepted.
Status run_dir_check_resume_config(const std::string& out_dir, const RunConfig& cfg, bool allow_changes,
                                   std::FILE* console);

}  // namespace grpo
