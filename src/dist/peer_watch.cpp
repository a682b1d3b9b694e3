// PeerWatch (see peer_watch.h): one thread polling the kept rendezvous sockets.
#include "dist/peer_watch.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "core/check.h"

namespace grpo {

namespace {
constexpr char kGoodbye = 'B';
constexpr char kNotice = 'U';
constexpr int kPollMs = 100;
}  // namespace

PeerWatch::PeerWatch(bool hub, std::vector<int> fds, std::vector<std::string> names)
    : hub_(hub), fds_(std::move(fds)), names_(std::move(names)), done_(fds_.size(), 0) {
  GRPO_CHECK(names_.size() == fds_.size());
  thread_ = std::thread([this] { run(); });
}

PeerWatch::~PeerWatch() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_) ::close(fd);
}

std::string PeerWatch::lost() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lost_;
}

void PeerWatch::finish() {
  finished_ = true;
  for (int fd : fds_) (void)::send(fd, &kGoodbye, 1, MSG_NOSIGNAL);  // a peer already gone: nothing to tell
}

void PeerWatch::notify() {
  for (int fd : fds_) (void)::send(fd, &kNotice, 1, MSG_NOSIGNAL);
}

Status PeerWatch::wait_notice(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(int64_t(std::min(timeout_s, 1e9) * 1000));  // no overflow
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return taken_ < notices_ || !lost_.empty(); });
  if (taken_ < notices_) {
    ++taken_;
    return ok_status();
  }
  if (!lost_.empty()) return error_status(lost_);
  return error_status("no update notice within " + std::to_string(int64_t(timeout_s)) + " s");
}

void PeerWatch::mark_lost(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (lost_.empty()) lost_ = why;
  }
  cv_.notify_all();
}

void PeerWatch::run() {
  std::vector<char> open(fds_.size(), 1);
  std::vector<pollfd> pf;
  std::vector<size_t> at;
  while (!stop_) {
    pf.clear();
    at.clear();
    for (size_t i = 0; i < fds_.size(); ++i)
      if (open[i]) {
        pf.push_back({fds_[i], POLLIN, 0});
        at.push_back(i);
      }
    if (pf.empty()) return;  // every peer has left
    const int n = ::poll(pf.data(), pf.size(), kPollMs);
    if (n <= 0) continue;
    for (size_t j = 0; j < pf.size(); ++j) {
      if (pf[j].revents == 0) continue;
      const size_t i = at[j];
      char b = 0;
      const ssize_t k = ::recv(fds_[i], &b, 1, 0);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k == 1) {
        if (b == kGoodbye) done_[i] = 1;
        if (b == kNotice) {
          {
            std::lock_guard<std::mutex> lk(mu_);
            ++notices_;
          }
          cv_.notify_all();
        }
        continue;  // read on until the peer closes
      }
      open[i] = 0;  // end-of-file or a reset
      if (done_[i] || finished_) continue;
      if (hub_) {
        mark_lost(names_[i] + " ended without finishing (killed, crashed or stopped by an error; see its log)");
        // Pass it on: every other process reads end-of-file from rank 0 now.
        for (size_t o = 0; o < fds_.size(); ++o)
          if (o != i && open[o]) ::shutdown(fds_[o], SHUT_RDWR);
      } else {
        mark_lost(names_[i] + " closed its connection without finishing: it or another process of the run ended "
                              "early (see " + names_[i] + "'s log)");
      }
    }
  }
}

}  // namespace grpo
