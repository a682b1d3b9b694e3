// PeerWatch (dist/peer_watch.h): the liveness links of an env launch and of the
// NCCL weight bridge. A peer that goes without a goodbye is reported by the hub
// and passed on to every other process; goodbyes are not failures; a killed
// process is noticed through the kernel closing its socket; the rendezvous hands
// over its connections with the right ranks.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "../net_test_util.h"
#include "core/timer.h"
#include "dist/bootstrap.h"
#include "dist/peer_watch.h"

using namespace grpo;

using grpo::test::free_port;

namespace {

// Polls w.lost() for up to `seconds`; returns it (empty if nothing came).
std::string wait_lost(const PeerWatch& w, double seconds) {
  const double end = now_seconds() + seconds;
  while (now_seconds() < end) {
    std::string l = w.lost();
    if (!l.empty()) return l;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return w.lost();
}

struct Star {  // rank 0 linked to ranks 1 and 2 through socket pairs
  std::unique_ptr<PeerWatch> hub, r1, r2;
  Star() {
    int a[2], b[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    hub = std::make_unique<PeerWatch>(true, std::vector<int>{a[0], b[0]}, std::vector<std::string>{"rank 1", "rank 2"});
    r1 = std::make_unique<PeerWatch>(false, std::vector<int>{a[1]}, std::vector<std::string>{"rank 0"});
    r2 = std::make_unique<PeerWatch>(false, std::vector<int>{b[1]}, std::vector<std::string>{"rank 0"});
  }
};

}  // namespace

TEST(PeerWatch, ARankGoneWithoutGoodbyeReachesTheHubAndEveryOtherRank) {
  Star s;
  EXPECT_EQ(wait_lost(*s.hub, 0.3), "");
  s.r2.reset();  // rank 2 ends without finish(): as if it had crashed
  const std::string hub = wait_lost(*s.hub, 2.0);
  EXPECT_NE(hub.find("rank 2 ended without finishing"), std::string::npos) << hub;
  const std::string other = wait_lost(*s.r1, 2.0);  // rank 1 hears of it through rank 0
  EXPECT_NE(other.find("rank 0 closed its connection without finishing"), std::string::npos) << other;
}

TEST(PeerWatch, GoodbyesAreNoFailure) {
  Star s;
  s.r1->finish();
  s.r2->finish();
  s.r1.reset();
  s.r2.reset();
  EXPECT_EQ(wait_lost(*s.hub, 0.5), "");
}

TEST(PeerWatch, TheHubFinishingFirstIsNoFailure) {
  Star s;
  s.hub->finish();
  s.hub.reset();
  EXPECT_EQ(wait_lost(*s.r1, 0.5), "");
  EXPECT_EQ(wait_lost(*s.r2, 0.5), "");
}

TEST(PeerWatch, AKilledProcessIsNoticedWithinAPollInterval) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the peer: holds its end until killed
    ::close(sv[0]);
    ::pause();
    ::_exit(0);
  }
  ::close(sv[1]);
  PeerWatch w(true, {sv[0]}, {"rank 1"});
  EXPECT_EQ(wait_lost(w, 0.3), "");
  const double t0 = now_seconds();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const std::string l = wait_lost(w, 2.0);
  EXPECT_NE(l.find("rank 1 ended without finishing"), std::string::npos) << l;
  EXPECT_LT(now_seconds() - t0, 1.0);
}

TEST(PeerWatch, RendezvousKeepsItsConnectionsWithTheirRanks) {
  const int port = free_port();
  KeptLinks k0, k1, k2;
  Result<std::string> r1 = error_status(""), r2 = error_status("");
  std::thread t1([&] { r1 = tcp_rendezvous("127.0.0.1", port, 1, 3, "", 10, &k1); });
  std::thread t2([&] { r2 = tcp_rendezvous("127.0.0.1", port, 2, 3, "", 10, &k2); });
  auto r0 = tcp_rendezvous("127.0.0.1", port, 0, 3, "the id", 10, &k0);
  t1.join();
  t2.join();
  ASSERT_TRUE(r0.ok()) << r0.status().message();
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r1.value(), "the id");
  EXPECT_EQ(r2.value(), "the id");
  ASSERT_EQ(k0.fds.size(), 2u);
  std::vector<int> ranks = k0.ranks;
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{1, 2}));
  ASSERT_EQ(k1.ranks, std::vector<int>{0});
  ASSERT_EQ(k2.ranks, std::vector<int>{0});
  std::vector<std::string> names;
  for (int r : k0.ranks) names.push_back("rank " + std::to_string(r));
  PeerWatch hub(true, k0.fds, names);
  PeerWatch w1(false, k1.fds, {"rank 0"});
  {
    PeerWatch w2(false, k2.fds, {"rank 0"});
  }  // rank 2's links close without a goodbye
  EXPECT_NE(wait_lost(hub, 2.0).find("rank 2 ended without finishing"), std::string::npos);
  EXPECT_NE(wait_lost(w1, 2.0).find("rank 0 closed"), std::string::npos);
}

TEST(PeerWatch, ARendezvousWaitingForRejoinsCanBeCancelled) {
  // The trainer's wait for restarted bridge servers (BridgeRejoin) has no deadline of its own.
  std::atomic<bool> cancel{false};
  const double t0 = now_seconds();
  std::thread stop([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  KeptLinks k;
  auto r = tcp_rendezvous("127.0.0.1", free_port(), 0, 2, "id", 1e9, &k, &cancel);
  stop.join();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cancelled"), std::string::npos) << r.status().message();
  EXPECT_LT(now_seconds() - t0, 2.0);
}

TEST(PeerWatch, UpdateNoticesAreCountedAndALossEndsTheWait) {
  // The NCCL weight bridge: a server waits for the trainer's notice on the host.
  Star s;
  EXPECT_FALSE(s.r1->wait_notice(0.2).ok());  // nothing announced yet: times out
  s.hub->notify();
  s.hub->notify();
  EXPECT_TRUE(s.r1->wait_notice(2.0).ok());
  EXPECT_TRUE(s.r1->wait_notice(2.0).ok());  // both notices, once each
  EXPECT_TRUE(s.r2->wait_notice(2.0).ok());
  EXPECT_FALSE(s.r1->wait_notice(0.2).ok());
  const double t0 = now_seconds();
  s.hub.reset();  // the trainer dies while a server waits
  Status st = s.r1->wait_notice(30.0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 0 closed"), std::string::npos) << st.message();
  EXPECT_LT(now_seconds() - t0, 2.0);
}
