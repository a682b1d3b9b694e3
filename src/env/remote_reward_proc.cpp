// LineProcess: posix_spawnp with three pipes, poll() loops with deadlines.
#include "env/remote_reward_proc.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/timer.h"

extern char** environ;

namespace grpo {

namespace {

constexpr size_t kTailBytes = 4096;
constexpr int kTailLines = 20;

// write(2) with SIGPIPE blocked on this thread, so a dead reader gives EPIPE
// instead of killing the trainer; the signal it left pending is consumed.
ssize_t write_nosigpipe(int fd, const char* p, size_t n) {
  sigset_t pipe_set, old_set, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  ssize_t w = ::write(fd, p, n);
  int err = errno;
  if (w < 0 && err == EPIPE && !was_pending) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {}
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  errno = err;
  return w;
}

void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
  return "ended (wait status " + std::to_string(st) + ")";
}

int ms_until(double deadline) {
  double left = deadline - now_seconds();
  if (left <= 0) return 0;
  return int(std::min(left * 1000.0 + 1.0, 60000.0));
}

}  // namespace

Status LineProcess::start(const std::vector<std::string>& argv) {
  stop();
  exit_reason_.clear();
  err_tail_.clear();
  out_buf_.clear();
  std::string shown;
  for (const auto& a : argv) shown += (shown.empty() ? "" : " ") + a;
  if (argv.empty()) return error_status("empty command");
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return error_status("pipe: " + std::string(strerror(errno)));
  if (pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]), ::close(in[1]);
    return error_status("pipe: " + std::string(strerror(errno)));
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    ::close(in[0]), ::close(in[1]), ::close(out[0]), ::close(out[1]);
    return error_status("pipe: " + std::string(strerror(errno)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&at, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&defaults, s);
  posix_spawnattr_setsigdefault(&at, &defaults);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, &at, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  ::close(in[0]), ::close(out[1]), ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]), ::close(out[0]), ::close(err[0]);
    return error_status("cannot start '" + shown + "': " + strerror(rc) +
                        (rc == ENOENT ? " (is " + argv[0] + " installed and in PATH?)" : std::string()));
  }
  pid_ = pid;
  in_fd_ = in[1], out_fd_ = out[0], err_fd_ = err[0];
  set_nonblock(in_fd_), set_nonblock(out_fd_), set_nonblock(err_fd_);
  return ok_status();
}

void LineProcess::drain_stderr() {
  char buf[4096];
  while (err_fd_ >= 0) {
    ssize_t n = ::read(err_fd_, buf, sizeof buf);
    if (n > 0) {
      err_tail_.append(buf, size_t(n));
      if (err_tail_.size() > 2 * kTailBytes) err_tail_.erase(0, err_tail_.size() - kTailBytes);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) ::close(err_fd_), err_fd_ = -1;
    return;
  }
}

std::string LineProcess::stderr_tail() const {
  std::string t = err_tail_.size() > kTailBytes ? err_tail_.substr(err_tail_.size() - kTailBytes) : err_tail_;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  size_t pos = t.size();
  for (int lines = 0; lines < kTailLines && pos != std::string::npos && pos > 0; ++lines) pos = t.rfind('\n', pos - 1);
  return pos == std::string::npos || pos == 0 ? t : t.substr(pos + 1);
}

void LineProcess::reap(double grace_s) {
  if (pid_ <= 0) return;
  const double deadline = now_seconds() + grace_s;
  int st = 0;
  for (;;) {
    // Keep reading stderr while waiting: a dying child's last words (a
    // traceback) arrive here, and a full pipe would block its exit.
    if (err_fd_ >= 0) {
      pollfd p = {err_fd_, POLLIN, 0};
      if (poll(&p, 1, std::min(ms_until(deadline), 10)) > 0) drain_stderr();
    } else {
      struct timespec ts = {0, 5 * 1000 * 1000};
      if (now_seconds() < deadline) nanosleep(&ts, nullptr);
    }
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) break;
    if (r < 0 && errno != EINTR) {
      exit_reason_ = "ended (waitpid: " + std::string(strerror(errno)) + ")";
      pid_ = -1;
      close_fds();
      return;
    }
    if (now_seconds() >= deadline) {
      ::kill(-pid_, SIGKILL);
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
      break;
    }
  }
  drain_stderr();
  exit_reason_ = describe_status(st);
  pid_ = -1;
  close_fds();
}

void LineProcess::close_fds() {
  for (int* fd : {&in_fd_, &out_fd_, &err_fd_})
    if (*fd >= 0) ::close(*fd), *fd = -1;
}

bool LineProcess::check_alive() {
  if (pid_ <= 0) return false;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) {
    drain_stderr();
    exit_reason_ = describe_status(st);
    pid_ = -1;
    close_fds();
  }
  return pid_ > 0;
}

void LineProcess::stop(double grace_s) {
  if (pid_ <= 0) {
    close_fds();
    return;
  }
  if (in_fd_ >= 0) ::close(in_fd_), in_fd_ = -1;  // EOF asks the child to finish
  reap(grace_s);
}

LineProcess::Event LineProcess::pump(std::string* out, double timeout_s, std::string* line) {
  const double deadline = now_seconds() + timeout_s;
  char buf[65536];
  for (;;) {
    size_t nl = out_buf_.find('\n');
    if (nl != std::string::npos) {
      line->assign(out_buf_, 0, nl);
      if (!line->empty() && line->back() == '\r') line->pop_back();
      out_buf_.erase(0, nl + 1);
      return Event::line;
    }
    if (pid_ <= 0) return Event::exited;
    if (out_fd_ < 0) {  // stdout closed: the child is ending (or has ended)
      reap(2.0);
      return Event::exited;
    }
    pollfd fds[3];
    int n = 0;
    fds[n++] = {out_fd_, POLLIN, 0};
    const int ei = err_fd_ >= 0 ? n : -1;
    if (ei >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    const int wi = (!out->empty() && in_fd_ >= 0) ? n : -1;
    if (wi >= 0) fds[n++] = {in_fd_, POLLOUT, 0};
    int pr = poll(fds, nfds_t(n), ms_until(deadline));
    if (pr < 0 && errno != EINTR) {
      stop(0);
      exit_reason_ = "killed after poll failed: " + std::string(strerror(errno));
      return Event::exited;
    }
    if (pr == 0 && now_seconds() >= deadline) return Event::timeout;
    if (pr <= 0) continue;
    if (wi >= 0 && (fds[wi].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = write_nosigpipe(in_fd_, out->data(), out->size());
      if (w > 0) out->erase(0, size_t(w));
      else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        // EPIPE: the child closed stdin and takes no more requests; keep
        // reading what it already answered until its stdout ends.
        ::close(in_fd_), in_fd_ = -1;
      }
    }
    if (ei >= 0 && (fds[ei].revents & (POLLIN | POLLHUP | POLLERR))) drain_stderr();
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = ::read(out_fd_, buf, sizeof buf);
      if (r > 0) out_buf_.append(buf, size_t(r));
      else if (r == 0) ::close(out_fd_), out_fd_ = -1;
      else if (errno != EAGAIN && errno != EINTR) ::close(out_fd_), out_fd_ = -1;
    }
  }
}

}  // namespace grpo
