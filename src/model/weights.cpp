#include "model/weights.h"

namespace grpo {

namespace {
// Walks the layout in arena order; `take` receives each tensor's shape.
template <class F>
void layout_walk(const ModelConfig& c, F&& take) {
  const int64_t C = c.hidden_size, V = c.vocab_size, F_ = c.intermediate_size, D = c.head_dim;
  take("embed", -1, std::vector<int64_t>{V, C});
  for (int l = 0; l < c.n_layers; ++l) {
    take("attn_norm", l, std::vector<int64_t>{C});
    take("wqkv", l, std::vector<int64_t>{c.qkv_dim(), C});
    if (c.attention_bias) take("bqkv", l, std::vector<int64_t>{c.qkv_dim()});
    if (c.qk_norm) {
      take("q_norm", l, std::vector<int64_t>{D});
      take("k_norm", l, std::vector<int64_t>{D});
    }
    take("wo", l, std::vector<int64_t>{C, c.q_dim()});
    take("mlp_norm", l, std::vector<int64_t>{C});
    take("w_gate_up", l, std::vector<int64_t>{2 * F_, C});
    take("w_down", l, std::vector<int64_t>{C, F_});
  }
  take("final_norm", -1, std::vector<int64_t>{C});
  if (!c.tie_word_embeddings) take("lm_head", -1, std::vector<int64_t>{V, C});
}

int64_t prod(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto x : s) n *= x;
  return n;
}
}  // namespace

int64_t weights_numel(const ModelConfig& cfg) {
  int64_t n = 0;
  layout_walk(cfg, [&](const char*, int, const std::vector<int64_t>& s) {
    // keep every tensor 16-element aligned so views stay 32/64-byte aligned for vector loads
    n += (prod(s) + 15) / 16 * 16;
  });
  return n;
}

void weights_bind(ModelWeights& w, const ModelConfig& cfg, Tensor arena) {
  GRPO_CHECK(arena.numel() >= weights_numel(cfg));
  w.config = cfg;
  w.dtype = arena.dtype;
  w.device = arena.device;
  w.arena = arena;
  w.layers.assign(size_t(cfg.n_layers), LayerWeights{});
  int64_t off = 0;
  const size_t es = dtype_size(arena.dtype);
  layout_walk(cfg, [&](const char* name, int l, const std::vector<int64_t>& s) {
    Tensor t = tensor_borrow(static_cast<char*>(arena.data) + size_t(off) * es, arena.dtype, arena.device, s);
    t.owner = arena.owner;
    off += (prod(s) + 15) / 16 * 16;
    std::string n = name;
    if (l < 0) {
      if (n == "embed") w.embed = t;
      else if (n == "final_norm") w.final_norm = t;
      else if (n == "lm_head") w.lm_head = t;
      return;
    }
    LayerWeights& L = w.layers[size_t(l)];
    if (n == "attn_norm") L.attn_norm = t;
    else if (n == "wqkv") L.wqkv = t;
    else if (n == "bqkv") L.bqkv = t;
    else if (n == "q_norm") L.q_norm = t;
    else if (n == "k_norm") L.k_norm = t;
    else if (n == "wo") L.wo = t;
    else if (n == "mlp_norm") L.mlp_norm = t;
    else if (n == "w_gate_up") L.w_gate_up = t;
    else if (n == "w_down") L.w_down = t;
  });
  if (cfg.tie_word_embeddings) w.lm_head = w.embed;
}

ModelWeights weights_allocate(const ModelConfig& cfg, Device dev, DType dt) {
  ModelWeights w;
  Tensor arena = tensor_empty(dev, dt, {weights_numel(cfg)});
  weights_bind(w, cfg, arena);
  return w;
}

std::vector<std::pair<std::string, Tensor*>> ModelWeights::params() {
  std::vector<std::pair<std::string, Tensor*>> out;
  out.emplace_back("embed", &embed);
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerWeights& L = layers[l];
    std::string p = "layers." + std::to_string(l) + ".";
    out.emplace_back(p + "attn_norm", &L.attn_norm);
    out.emplace_back(p + "wqkv", &L.wqkv);
    if (!L.bqkv.empty()) out.emplace_back(p + "bqkv", &L.bqkv);
    if (!L.q_norm.empty()) out.emplace_back(p + "q_norm", &L.q_norm);
    if (!L.k_norm.empty()) out.emplace_back(p + "k_norm", &L.k_norm);
    out.emplace_back(p + "wo", &L.wo);
    out.emplace_back(p + "mlp_norm", &L.mlp_norm);
    out.emplace_back(p + "w_gate_up", &L.w_gate_up);
    out.emplace_back(p + "w_down", &L.w_down);
  }
  out.emplace_back("final_norm", &final_norm);
  if (!config.tie_word_embeddings) out.emplace_back("lm_head", &lm_head);
  return out;
}

}  // namespace grpo
