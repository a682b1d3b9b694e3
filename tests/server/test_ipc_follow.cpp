// The CPU-testable parts of the CUDA IPC bridge (dist/ipc_bridge.h): the shared
// version page seen through two mappings (and a child process), the follower that
// turns a moved version into a prefix-cache reset and a new policy version, and
// the clear refusals of a build without CUDA. The GPU run is
// tools/device/ipc_bridge_test.sh.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "dist/ipc_bridge.h"
#include "server/ipc_follow.h"
#include "server_test_util.h"

namespace fs = std::filesystem;
using namespace grpo;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("grpo_ipc_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

}  // namespace

TEST(IpcBridge, VersionPageIsSharedBetweenMappingsAndProcesses) {
  const std::string path = fresh_dir("page") + "/" + kIpcVersionFile;
  auto writer = IpcVersionPage::open(path, true);
  ASSERT_TRUE(writer.ok()) << writer.status().message();
  auto reader = IpcVersionPage::open(path, false);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  EXPECT_EQ(reader.value()->load(), 0);
  writer.value()->store(41);
  EXPECT_EQ(reader.value()->load(), 41);
  const pid_t pid = ::fork();
  if (pid == 0) {
    auto child = IpcVersionPage::open(path, false);
    if (!child.ok() || child.value()->load() != 41) ::_exit(2);
    child.value()->store(42);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(reader.value()->load(), 42);
  auto missing = IpcVersionPage::open(path + ".nope", false);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

TEST(IpcBridge, FollowerResetsThePrefixCacheAndBumpsTheVersion) {
  grpo::test::Served s;
  std::atomic<int64_t> trainer_version{0};
  IpcFollower f(s.svc, s.eng, [&] { return trainer_version.load(); }, [] { return true; }, 0.001);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 2;
  const std::vector<int32_t> prompt(40, int32_t('7'));  // several full KV blocks (block size 8)
  auto ask = [&] {
    auto out = s.svc.generate({prompt}, p);
    GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
    return out.value()[0].telemetry.prefix_hit_tokens;
  };
  ask();
  EXPECT_GT(ask(), 0) << "the same prompt again is a prefix-cache hit";
  EXPECT_FALSE(f.poll());
  trainer_version = 5;
  EXPECT_TRUE(f.poll());
  EXPECT_EQ(s.svc.policy_version(), 5);
  EXPECT_EQ(ask(), 0) << "KV of the old weights must not serve the new ones";
  EXPECT_FALSE(f.poll());

  // The background thread does the same, and notices the trainer leaving.
  std::atomic<bool> alive{true};
  IpcFollower g(s.svc, s.eng, [&] { return trainer_version.load(); }, [&] { return alive.load(); }, 0.001);
  g.start();
  trainer_version = 6;
  for (int i = 0; i < 5000 && s.svc.policy_version() != 6; ++i) ::usleep(1000);
  EXPECT_EQ(s.svc.policy_version(), 6);
  alive = false;
  for (int i = 0; i < 5000 && !g.trainer_gone(); ++i) ::usleep(1000);
  EXPECT_TRUE(g.trainer_gone());
  g.stop();
}

#ifndef GRPO_HAVE_CUDA
TEST(IpcBridge, CpuBuildRefusesExportAndAttach) {
  const std::string dir = fresh_dir("cpu");
  auto x = IpcExporter::create(dir, grpo::test::arith().w, grpo::test::arith_dir(), 0);
  ASSERT_FALSE(x.ok());
  EXPECT_NE(x.status().message().find("no CUDA backend"), std::string::npos) << x.status().message();
  auto a = IpcAttachment::open(dir);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--watch"), std::string::npos) << a.status().message();
}
#endif
