// CPU inference forward throughput (transformer_forward over a paged KV cache,
// f32, random weights): prefill of one prompt, decode of one sequence, and
// decode of a batch of sequences (one token each per step). No peer runs here
// (no PyTorch on the build machine); the figures are for tracking the CPU
// backend across commits. Also reports decode tokens per process CPU-second,
// which is stable when other jobs share the cores.
//
//   ./build/bench_cpu_forward [--presets tiny-llama,qwen2.5-0.5b] [--threads N]
//                             [--prompt 32] [--steps 16] [--batch 8] [--out bench/results/...json]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "model/presets.h"
#include "model/transformer.h"

using namespace grpo;

namespace {

struct Options {
  std::vector<std::string> presets = {"tiny-llama", "qwen2.5-0.5b"};
  int threads = 0, prompt = 32, steps = 16, batch = 8;
  std::string out = "bench/results/bench_cpu_forward.json";
};

// A batch of n_seqs sequences in their own blocks; every call feeds one chunk per sequence.
struct Runner {
  Context& ctx;
  const ModelWeights& w;
  int bs = 16, max_blocks, n_seqs;
  KVCache cache;
  RopeTable rope;
  ForwardScratch scratch;
  std::vector<int32_t> table;
  std::vector<int> pos;
  Runner(Context& c, const ModelWeights& wt, int seqs, int max_len, int max_tokens)
      : ctx(c), w(wt), max_blocks((max_len + 15) / 16), n_seqs(seqs) {
    cache = kv_cache_allocate(w.config, Device::cpu, w.dtype, seqs * max_blocks, bs);
    rope = rope_table_build(w.config, Device::cpu, max_len);
    scratch = forward_scratch_allocate(w.config, Device::cpu, w.dtype, max_tokens, seqs);
    for (int i = 0; i < seqs * max_blocks; ++i) table.push_back(i);
    pos.assign(size_t(seqs), 0);
  }
  // Feeds `n` tokens to each of the first `seqs` sequences; logits of each one's last token.
  void step(int seqs, int n) {
    std::vector<int32_t> toks, ps, sq, slot, rows;
    for (int s = 0; s < seqs; ++s) {
      for (int i = 0; i < n; ++i) {
        const int p = pos[size_t(s)]++;
        toks.push_back(int32_t((p * 7919 + s * 31) % w.config.vocab_size));
        ps.push_back(p);
        sq.push_back(s);
        slot.push_back(table[size_t(s * max_blocks + p / bs)] * bs + p % bs);
      }
      rows.push_back(int32_t(toks.size()) - 1);
    }
    const int64_t T = int64_t(toks.size()), R = int64_t(rows.size());
    ForwardBatch b;
    b.tokens = tensor_borrow(toks.data(), DType::i32, Device::cpu, {T});
    b.positions = tensor_borrow(ps.data(), DType::i32, Device::cpu, {T});
    b.logit_rows = tensor_borrow(rows.data(), DType::i32, Device::cpu, {R});
    b.attn.token_seq = tensor_borrow(sq.data(), DType::i32, Device::cpu, {T});
    b.attn.token_pos = b.positions;
    b.attn.slot_mapping = tensor_borrow(slot.data(), DType::i32, Device::cpu, {T});
    b.attn.block_table = tensor_borrow(table.data(), DType::i32, Device::cpu, {n_seqs, max_blocks});
    b.attn.block_size = bs;
    b.attn.max_context = *std::max_element(ps.begin(), ps.end()) + 1;
    Tensor logits = tensor_empty(Device::cpu, DType::f32, {R, w.config.vocab_size});
    transformer_forward(ctx, w, cache, rope, b, scratch, logits);
  }
};

// Process CPU time over all threads: on a shared machine, tokens per CPU-second
// shows the cost independent of how many cores other jobs left us.
double cpu_seconds() { return double(std::clock()) / CLOCKS_PER_SEC; }

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--presets") o.presets = split(v);
    else if (k == "--threads") o.threads = std::atoi(v.c_str());
    else if (k == "--prompt") o.prompt = std::atoi(v.c_str());
    else if (k == "--steps") o.steps = std::atoi(v.c_str());
    else if (k == "--batch") o.batch = std::atoi(v.c_str());
    else if (k == "--out") o.out = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  ContextOptions co;
  co.n_threads = o.threads;
  Context ctx(co);
  nlohmann::json metrics = nlohmann::json::object();
  std::printf("CPU forward, f32, %d threads, prompt %d, %d decode steps, batch %d\n", ctx.n_threads(), o.prompt,
              o.steps, o.batch);
  std::printf("%-14s %12s %14s %14s %16s %16s\n", "preset", "params (M)", "prefill tok/s", "decode tok/s",
              "decode bN tok/s", "decode tok/cpu-s");
  for (const std::string& name : o.presets) {
    Result<ModelConfig> cfg = preset_config(name);
    if (!cfg.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), cfg.status().message().c_str());
      return 1;
    }
    ModelWeights w = weights_allocate(cfg.value(), Device::cpu, DType::f32);
    weights_init_random(w, 1, &ctx);
    const int max_len = o.prompt + o.steps + 1;
    double prefill = 0, dec1 = 0, decb = 0, dec1_cpu = 0;
    {
      Runner warm(ctx, w, 1, max_len, o.prompt);  // first touches of weights and BLAS buffers
      warm.step(1, o.prompt);
    }
    {
      Runner r(ctx, w, 1, max_len, o.prompt);
      double t0 = now_seconds();
      r.step(1, o.prompt);
      prefill = o.prompt / (now_seconds() - t0);
      r.step(1, 1);  // warm-up decode step
      t0 = now_seconds();
      const double c0 = cpu_seconds();
      for (int s = 1; s < o.steps; ++s) r.step(1, 1);
      dec1 = (o.steps - 1) / (now_seconds() - t0);
      dec1_cpu = (o.steps - 1) / (cpu_seconds() - c0);
    }
    {
      Runner r(ctx, w, o.batch, max_len, o.batch * o.prompt);
      r.step(o.batch, o.prompt);
      r.step(o.batch, 1);
      const double t0 = now_seconds();
      for (int s = 1; s < o.steps; ++s) r.step(o.batch, 1);
      decb = double(o.batch) * (o.steps - 1) / (now_seconds() - t0);
    }
    std::printf("%-14s %12.1f %14.1f %14.2f %16.2f %16.2f\n", name.c_str(), double(cfg->n_params()) / 1e6, prefill,
                dec1, decb, dec1_cpu);
    metrics[name] = {{"prefill_tok_s", prefill}, {"decode_tok_s", dec1}, {"decode_batch_tok_s", decb},
                     {"decode_tok_per_cpu_s", dec1_cpu}, {"n_params", cfg->n_params()}};
  }
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json j = {{"bench", "bench_cpu_forward"},
                      {"date", date},
                      {"device", "cpu x" + std::to_string(ctx.n_threads()) + " threads (f32, OpenBLAS 1 thread/task)"},
                      {"command", command},
                      {"config", {{"prompt", o.prompt}, {"steps", o.steps}, {"batch", o.batch}, {"dtype", "f32"}}},
                      {"metrics", metrics},
                      {"peer", nullptr},
                      {"ratios", nlohmann::json::object()}};
  std::ofstream f(o.out);
  if (f) f << j.dump(2) << "\n";
  else std::fprintf(stderr, "could not write %s\n", o.out.c_str());
  return 0;
}
