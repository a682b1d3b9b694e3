// The reload bridge (server/weight_watch.h) on the tiny byte-level model: only
// complete checkpoints count, a reload serves exactly what a fresh engine on the
// checkpoint serves, requests in flight finish on the old weights, a different
// architecture or adapter shape is refused while the old weights keep serving,
// and LoRA adapters reload into the engine's adapter in place. The references are
// separate engines built from the checkpoint files, never the watched engine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/timer.h"
#include "engine/engine_service.h"
#include "model/checkpoint.h"
#include "model/lora.h"
#include "server_test_util.h"
#include "server/weight_watch.h"
#include "train/checkpoint_state.h"
#include "train/optimizer.h"

namespace fs = std::filesystem;
using namespace grpo;
using grpo::test::arith_dir;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("grpo_watch_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

ModelWeights load_arith() {
  auto w = model_load(arith_dir(), Device::cpu, DType::f32);
  GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
  return std::move(w).value();
}

// Greedy logits become their negation: the argmax changes at every position, so
// any output of the new weights differs from the old ones'.
void negate_final_norm(ModelWeights& w) {
  std::vector<float> v = tensor_to_f32(w.final_norm);
  for (float& x : v) x = -x;
  Tensor t = tensor_from_f32(Device::cpu, DType::f32, v, {int64_t(v.size())});
  tensor_copy(w.final_norm, t);
}

// Saves through the trainer's own writer (partial directory, fsync, rename).
std::string save_full(Context& ctx, const std::string& out, ModelWeights& w, int64_t step) {
  Optimizer opt = optimizer_create(ctx, w, AdamWConfig{});
  TrainerState st;
  st.step = step;
  auto r = checkpoint_save(ctx, out, w, opt, st, CheckpointSaveOptions{});
  GRPO_CHECK_MSG(r.ok(), r.status().message().c_str());
  return r.value();
}

std::string save_adapter(Context& ctx, const std::string& out, const ModelWeights& base, LoraWeights& l, int64_t step) {
  Optimizer opt = optimizer_create_lora(ctx, l, AdamWConfig{});
  TrainerState st;
  st.step = step;
  auto r = checkpoint_save(ctx, out, base, opt, st, CheckpointSaveOptions{});
  GRPO_CHECK_MSG(r.ok(), r.status().message().c_str());
  return r.value();
}

// An adapter whose B is not zero (PEFT's init would leave the model unchanged).
LoraWeights random_adapter(const ModelConfig& mc, int r, uint64_t seed) {
  LoraConfig lc;
  lc.enabled = true;
  lc.r = r;
  lc.alpha = float(2 * r);
  LoraWeights l = lora_allocate(mc, lc, Device::cpu, DType::f32);
  lora_init(l, seed);
  std::mt19937 g(uint32_t(seed) + 7);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (auto& [name, t] : l.params()) {
    if (name.back() != 'B') continue;
    float* p = t->ptr<float>();  // a host f32 arena
    for (int64_t i = 0; i < t->numel(); ++i) p[i] = nd(g);
  }
  return l;
}

SamplingParams greedy(int n_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n_tokens;
  p.ignore_eos = true;
  return p;
}

const std::vector<int32_t> kPrompt = {'1', '2', '+', '3', '4', '='};

// What a fresh engine on `w` (and adapter) answers: the reference.
std::vector<int32_t> reference(ModelWeights& w, const LoraWeights* lora, int n_tokens) {
  Context ctx(grpo::test::deterministic_cpu());
  EngineOptions eo = grpo::test::test_engine_options();
  eo.lora = lora;
  Engine eng(ctx, w, nullptr, eo);
  auto out = eng.generate({kPrompt}, greedy(n_tokens));
  GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
  return out.value()[0].completion_ids;
}

struct Watched {
  explicit Watched(const std::string& dir, const LoraWeights* initial_lora = nullptr)
      : ctx(grpo::test::deterministic_cpu()), w(load_arith()) {
    EngineOptions eo = grpo::test::test_engine_options();
    if (initial_lora) {
      lora = std::make_unique<LoraWeights>(lora_allocate(w.config, initial_lora->cfg, Device::cpu, DType::f32));
      tensor_copy(lora->arena, initial_lora->arena);
      eo.lora = lora.get();
    }
    eng = std::make_unique<Engine>(ctx, w, nullptr, eo);
    svc = std::make_unique<EngineService>(*eng, ServiceOptions{});
    watcher = std::make_unique<WeightWatcher>(*svc, *eng, ctx, w, lora.get(), WatchOptions{dir, 0.05});
  }
  ~Watched() {
    watcher->stop();
    svc->stop();
  }
  std::pair<std::vector<int32_t>, int64_t> ask(int n_tokens) {
    auto ch = svc->submit(kPrompt, greedy(n_tokens), false);
    GRPO_CHECK_MSG(ch.ok(), ch.status().message().c_str());
    while (!ch.value()->wait(nullptr, std::chrono::milliseconds(100))) {
    }
    auto outs = ch.value()->take_outputs();
    GRPO_CHECK_MSG(outs.size() == 1, ch.value()->error().message().c_str());
    return {outs[0].completion_ids, ch.value()->policy_version()};
  }
  Context ctx;
  ModelWeights w;
  std::unique_ptr<LoraWeights> lora;
  std::unique_ptr<Engine> eng;
  std::unique_ptr<EngineService> svc;
  std::unique_ptr<WeightWatcher> watcher;
};

}  // namespace

TEST(WeightWatch, FindsOnlyCompleteCheckpoints) {
  const std::string out = fresh_dir("find");
  Context ctx(grpo::test::deterministic_cpu());
  ModelWeights w = load_arith();
  auto none = watch_find_latest(out);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().has_value());
  // A save still in progress and a checkpoint-N without trainer_state.json are not complete.
  ASSERT_TRUE(model_save(out + "/checkpoint-9.partial-1234", w).ok());
  ASSERT_TRUE(model_save(out + "/checkpoint-8", w).ok());
  none = watch_find_latest(out);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().has_value());
  save_full(ctx, out, w, 2);
  const std::string p5 = save_full(ctx, out, w, 5);
  auto c = watch_find_latest(out);
  ASSERT_TRUE(c.ok() && c.value().has_value());
  EXPECT_EQ(c.value()->path, p5);
  EXPECT_EQ(c.value()->step, 5);
  EXPECT_FALSE(c.value()->adapter);
  // One checkpoint directory watched by itself.
  auto one = watch_find_latest(p5);
  ASSERT_TRUE(one.ok() && one.value().has_value());
  EXPECT_EQ(one.value()->step, 5);
  auto bad = watch_find_latest(out + "/nope");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a directory"), std::string::npos) << bad.status().message();
}

TEST(WeightWatch, ReloadServesTheNewCheckpointAndBumpsTheVersion) {
  const std::string out = fresh_dir("reload");
  ModelWeights base = load_arith();
  const auto ref_old = reference(base, nullptr, 24);
  ModelWeights trained = load_arith();
  negate_final_norm(trained);
  Watched s(out);
  EXPECT_EQ(s.ask(24), std::make_pair(ref_old, int64_t(0)));
  auto nothing = s.watcher->poll();
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(nothing.value());

  Context ctx(grpo::test::deterministic_cpu());
  const std::string p7 = save_full(ctx, out, trained, 7);
  auto fresh = model_load(p7, Device::cpu, DType::f32);
  ASSERT_TRUE(fresh.ok()) << fresh.status().message();
  const auto ref_new = reference(fresh.value(), nullptr, 24);
  ASSERT_NE(ref_new, ref_old) << "the test needs weights that answer differently";

  const double t0 = now_seconds();
  auto r = s.watcher->poll();
  const double dt = now_seconds() - t0;
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r.value());
  WatchStats st = s.watcher->stats();
  std::printf("[ reload ] tiny model on CPU: %.4f s (read %.4f s, wait %.4f s, swap %.5f s)\n", dt, st.last_stage_s,
              st.last_pause_s, st.last_swap_s);
  EXPECT_LT(dt, 5.0);
  EXPECT_EQ(st.version, 7);
  EXPECT_EQ(s.svc->policy_version(), 7);
  EXPECT_EQ(s.ask(24), std::make_pair(ref_new, int64_t(7)));
  // The same checkpoint is not loaded twice.
  auto again = s.watcher->poll();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again.value());
}

TEST(WeightWatch, InFlightRequestsFinishOnTheOldWeights) {
  const std::string out = fresh_dir("inflight");
  ModelWeights base = load_arith();
  const int kLong = 300;
  const auto ref_old = reference(base, nullptr, kLong);
  Watched s(out);
  auto ch = s.svc->submit(kPrompt, greedy(kLong), false);
  ASSERT_TRUE(ch.ok());
  ASSERT_TRUE(ch.value()->wait_admitted(std::chrono::milliseconds(10000)));
  ModelWeights trained = load_arith();
  negate_final_norm(trained);
  Context ctx(grpo::test::deterministic_cpu());
  save_full(ctx, out, trained, 3);
  auto r = s.watcher->poll();  // pauses until the request above is done
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r.value());
  while (!ch.value()->wait(nullptr, std::chrono::milliseconds(100))) {
  }
  auto outs = ch.value()->take_outputs();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].completion_ids, ref_old);
  EXPECT_EQ(ch.value()->policy_version(), 0);
  EXPECT_EQ(s.ask(8).second, 3);
}

TEST(WeightWatch, RefusesAnotherArchitectureAndKeepsServing) {
  const std::string out = fresh_dir("refuse");
  ModelWeights trained = load_arith();
  negate_final_norm(trained);
  Context ctx(grpo::test::deterministic_cpu());
  Watched s(out);
  save_full(ctx, out, trained, 1);
  ASSERT_TRUE(s.watcher->poll().ok());
  const auto served = s.ask(16);
  ASSERT_EQ(served.second, 1);

  ModelConfig other = trained.config;
  other.intermediate_size = 64;
  ModelWeights wide = weights_allocate(other, Device::cpu, DType::f32);
  tensor_fill_zero(wide.arena);
  save_full(ctx, out, wide, 2);
  auto r = s.watcher->poll();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("intermediate_size"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("checkpoint-2"), std::string::npos) << r.status().message();
  EXPECT_EQ(s.ask(16), served);
  EXPECT_EQ(s.watcher->stats().n_refused, 1);
  auto again = s.watcher->poll();  // not retried until it changes
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again.value());

  // A LoRA adapter cannot go into a server without an adapter slot.
  LoraWeights l = random_adapter(trained.config, 4, 11);
  save_adapter(ctx, out, trained, l, 3);
  auto ra = s.watcher->poll();
  ASSERT_FALSE(ra.ok());
  EXPECT_NE(ra.status().message().find("--lora"), std::string::npos) << ra.status().message();
  EXPECT_EQ(s.ask(16), served);
}

TEST(WeightWatch, AdaptersReloadInPlace) {
  const std::string out = fresh_dir("lora");
  Context ctx(grpo::test::deterministic_cpu());
  ModelWeights base = load_arith();
  LoraWeights l1 = random_adapter(base.config, 4, 1);
  LoraWeights l2 = random_adapter(base.config, 4, 2);
  save_adapter(ctx, out, base, l1, 10);
  Watched s(out, &l1);
  void* slot_ptr = s.lora->arena.data;
  const std::string p20 = save_adapter(ctx, out, base, l2, 20);
  auto ref_l2 = lora_load(p20, base.config, Device::cpu, DType::f32);
  ASSERT_TRUE(ref_l2.ok()) << ref_l2.status().message();
  const auto want = reference(base, &ref_l2.value(), 20);
  ASSERT_NE(want, reference(base, &l1, 20)) << "the test needs adapters that answer differently";

  auto r = s.watcher->poll();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r.value());
  EXPECT_EQ(s.ask(20), std::make_pair(want, int64_t(20)));
  EXPECT_EQ(s.lora->arena.data, slot_ptr);  // the engine's buffers, rewritten in place

  // Another rank is refused; the adapter of step 20 keeps serving.
  LoraWeights l8 = random_adapter(base.config, 8, 3);
  save_adapter(ctx, out, base, l8, 30);
  auto bad = s.watcher->poll();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("r=8"), std::string::npos) << bad.status().message();
  EXPECT_EQ(s.ask(20), std::make_pair(want, int64_t(20)));
}

TEST(WeightWatch, BackgroundThreadPicksUpNewCheckpoints) {
  const std::string out = fresh_dir("thread");
  Watched s(out);
  s.watcher->start();
  ModelWeights trained = load_arith();
  negate_final_norm(trained);
  Context ctx(grpo::test::deterministic_cpu());
  save_full(ctx, out, trained, 4);
  const double t0 = now_seconds();
  while (s.svc->policy_version() != 4 && now_seconds() - t0 < 10) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(s.svc->policy_version(), 4);
  EXPECT_EQ(s.ask(4).second, 4);
}
