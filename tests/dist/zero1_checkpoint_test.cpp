// ZeRO-1 state without MPI: an optimizer created over a shard allocates only
// that shard, and checkpoint_load into it reads exactly the shard's range of a
// full checkpoint and rounds the file's full fp32 master into the bf16
// weights. The expected values are the ones written into the full optimizer
// here, and the bf16 rounding comes from tensor_from_f32 (not the cast kernel
// the loader uses).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "dist/communicator.h"
#include "model/presets.h"
#include "train/checkpoint_state.h"
#include "train/data_parallel.h"

namespace fs = std::filesystem;

namespace {

using namespace grpo;

void fill(Tensor& t, float scale, float shift) {
  float* p = static_cast<float*>(t.data);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = shift + scale * float((i * 7919) % 1009) / 1009.f;
}

TEST(Zero1Checkpoint, ShardsLoadTheirRangeOfAFullCheckpoint) {
  Context ctx;
  auto cfg = preset_config("tiny-qwen3");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  ModelWeights w = weights_random(cfg.value(), Device::cpu, DType::bf16, 7, &ctx);
  Optimizer full = optimizer_create(ctx, w, AdamWConfig{});
  const int64_t n = optimizer_numel(full);
  ASSERT_FALSE(optimizer_is_sharded(full));
  fill(full.master, 0.5f, -0.25f);
  fill(full.m, 1e-3f, 0.f);
  fill(full.v, 1e-6f, 1e-8f);
  full.step = 5;
  TrainerState st;
  st.step = 5;
  const std::string dir = (fs::temp_directory_path() / ("grpo_zero1_ckpt_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  auto saved = checkpoint_save(ctx, dir, w, full, st, CheckpointSaveOptions{});
  ASSERT_TRUE(saved.ok()) << saved.status().message();

  const std::vector<float> master = tensor_to_f32(full.master), m = tensor_to_f32(full.m), v = tensor_to_f32(full.v);
  const Tensor rounded = tensor_from_f32(Device::cpu, DType::bf16, master, {n});
  for (int world : {1, 3}) {
    const std::vector<int64_t> b = zero1_shards(n, world);
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
      ModelWeights w2 = weights_random(cfg.value(), Device::cpu, DType::bf16, 99, &ctx);
      Optimizer o = optimizer_create(ctx, w2, AdamWConfig{}, b[size_t(r)], b[size_t(r) + 1]);
      const int64_t len = b[size_t(r) + 1] - b[size_t(r)];
      ASSERT_EQ(o.m.numel(), len);
      ASSERT_EQ(o.v.numel(), len);
      ASSERT_EQ(o.master.numel(), len);
      ASSERT_EQ(o.grad_arena.numel(), n);
      auto ls = checkpoint_load(ctx, saved.value(), w2, o);
      ASSERT_TRUE(ls.ok()) << ls.status().message();
      EXPECT_EQ(o.step, 5);
      const std::vector<float> om = tensor_to_f32(o.m), ov = tensor_to_f32(o.v), oma = tensor_to_f32(o.master);
      for (int64_t i = 0; i < len; ++i) {
        const size_t g = size_t(b[size_t(r)] + i);
        ASSERT_EQ(om[size_t(i)], m[g]) << "m at " << g;
        ASSERT_EQ(ov[size_t(i)], v[g]) << "v at " << g;
        ASSERT_EQ(oma[size_t(i)], master[g]) << "master at " << g;
      }
      // Every rank holds the full bf16 weights, rounded from the file's full master.
      EXPECT_EQ(std::memcmp(w2.arena.data, rounded.data, w2.arena.nbytes()), 0);
    }
  }
  fs::remove_all(dir);
}

}  // namespace
