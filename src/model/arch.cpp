// The per-architecture HF weight-name tables. Llama, Mistral, Qwen2 and Qwen3
// share the Llama module tree; they differ in which optional tensors exist
// (q/k/v bias, q_norm/k_norm), which the `when` column states.
#include "model/arch.h"

namespace grpo {

namespace {
using S = WeightSlot;
using P = WeightPart;
using W = WeightWhen;

// Tensor names in HF order, as in a transformers state_dict.
#define GRPO_LLAMA_TREE(BIAS_WHEN)                                                          \
  {"model.embed_tokens.weight", false, S::embed, P::whole, W::always},                      \
  {"model.layers.{i}.input_layernorm.weight", true, S::attn_norm, P::whole, W::always},     \
  {"model.layers.{i}.self_attn.q_proj.weight", true, S::wqkv, P::q, W::always},             \
  {"model.layers.{i}.self_attn.q_proj.bias", true, S::bqkv, P::q, BIAS_WHEN},               \
  {"model.layers.{i}.self_attn.k_proj.weight", true, S::wqkv, P::k, W::always},             \
  {"model.layers.{i}.self_attn.k_proj.bias", true, S::bqkv, P::k, BIAS_WHEN},               \
  {"model.layers.{i}.self_attn.v_proj.weight", true, S::wqkv, P::v, W::always},             \
  {"model.layers.{i}.self_attn.v_proj.bias", true, S::bqkv, P::v, BIAS_WHEN},               \
  {"model.layers.{i}.self_attn.o_proj.weight", true, S::wo, P::whole, W::always},           \
  {"model.layers.{i}.self_attn.q_norm.weight", true, S::q_norm, P::whole, W::qk_norm},      \
  {"model.layers.{i}.self_attn.k_norm.weight", true, S::k_norm, P::whole, W::qk_norm},      \
  {"model.layers.{i}.post_attention_layernorm.weight", true, S::mlp_norm, P::whole, W::always}, \
  {"model.layers.{i}.mlp.gate_proj.weight", true, S::w_gate_up, P::gate, W::always},        \
  {"model.layers.{i}.mlp.up_proj.weight", true, S::w_gate_up, P::up, W::always},            \
  {"model.layers.{i}.mlp.down_proj.weight", true, S::w_down, P::whole, W::always},          \
  {"model.norm.weight", false, S::final_norm, P::whole, W::always},                         \
  {"lm_head.weight", false, S::lm_head, P::whole, W::untied}

const ArchSpec kLlama{Arch::llama, "llama", "LlamaForCausalLM", {GRPO_LLAMA_TREE(W::attention_bias)},
                      {"rotary_emb.inv_freq"}};
// Mistral has the Llama tree without any attention bias.
const ArchSpec kMistral{Arch::mistral, "mistral", "MistralForCausalLM", {GRPO_LLAMA_TREE(W::attention_bias)},
                        {"rotary_emb.inv_freq"}};
// Qwen2 always has q/k/v bias (the config sets attention_bias for it).
const ArchSpec kQwen2{Arch::qwen2, "qwen2", "Qwen2ForCausalLM", {GRPO_LLAMA_TREE(W::attention_bias)},
                      {"rotary_emb.inv_freq"}};
// Qwen3: per-head q_norm/k_norm; bias only with attention_bias=true.
const ArchSpec kQwen3{Arch::qwen3, "qwen3", "Qwen3ForCausalLM", {GRPO_LLAMA_TREE(W::attention_bias)},
                      {"rotary_emb.inv_freq"}};
#undef GRPO_LLAMA_TREE

bool exists(const ModelConfig& c, WeightWhen w) {
  switch (w) {
    case W::always: return true;
    case W::attention_bias: return c.attention_bias;
    case W::qk_norm: return c.qk_norm;
    case W::untied: return !c.tie_word_embeddings;
  }
  return false;
}

// Rows of the slot that a part covers, and the HF tensor's shape.
void part_rows(const ModelConfig& c, WeightSlot s, WeightPart p, int64_t* b, int64_t* e, std::vector<int64_t>* shape) {
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t Q = c.q_dim(), KV = c.kv_dim();
  int64_t cols = 0;  // 0 = the tensor is 1-D
  int64_t rows = 0;
  switch (s) {
    case S::embed: case S::lm_head: rows = V; cols = C; break;
    case S::attn_norm: case S::mlp_norm: case S::final_norm: rows = C; break;
    case S::q_norm: case S::k_norm: rows = D; break;
    case S::wqkv: case S::bqkv: rows = Q + 2 * KV; cols = s == S::wqkv ? C : 0; break;
    case S::wo: rows = C; cols = Q; break;
    case S::w_gate_up: rows = 2 * F; cols = C; break;
    case S::w_down: rows = C; cols = F; break;
  }
  *b = 0;
  *e = rows;
  switch (p) {
    case P::whole: break;
    case P::q: *b = 0; *e = Q; break;
    case P::k: *b = Q; *e = Q + KV; break;
    case P::v: *b = Q + KV; *e = Q + 2 * KV; break;
    case P::gate: *b = 0; *e = F; break;
    case P::up: *b = F; *e = 2 * F; break;
  }
  shape->assign({*e - *b});
  if (cols) shape->push_back(cols);
}

std::string subst_layer(const char* pattern, int l) {
  std::string s = pattern;
  size_t at = s.find("{i}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(l));
  return s;
}
}  // namespace

const ArchSpec& arch_spec(Arch a) {
  switch (a) {
    case Arch::llama: return kLlama;
    case Arch::mistral: return kMistral;
    case Arch::qwen2: return kQwen2;
    case Arch::qwen3: return kQwen3;
  }
  return kLlama;
}

std::vector<HfTensorSpec> arch_tensors(const ModelConfig& cfg) {
  const ArchSpec& spec = arch_spec(cfg.arch);
  std::vector<HfTensorSpec> out;
  auto add = [&](const ArchWeightName& n, int l) {
    HfTensorSpec t;
    t.name = n.per_layer ? subst_layer(n.hf_name, l) : n.hf_name;
    t.slot = n.slot;
    t.layer = l;
    part_rows(cfg, n.slot, n.part, &t.row_begin, &t.row_end, &t.shape);
    out.push_back(std::move(t));
  };
  size_t i = 0;
  // model-level tensors before the layers, then all layers, then the rest (HF order)
  for (; i < spec.names.size() && !spec.names[i].per_layer; ++i)
    if (exists(cfg, spec.names[i].when)) add(spec.names[i], -1);
  size_t first_layer = i;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (size_t k = first_layer; k < spec.names.size() && spec.names[k].per_layer; ++k)
      if (exists(cfg, spec.names[k].when)) add(spec.names[k], l);
  for (; i < spec.names.size(); ++i)
    if (!spec.names[i].per_layer && exists(cfg, spec.names[i].when)) add(spec.names[i], -1);
  return out;
}

bool arch_is_harmless_extra(const ModelConfig& cfg, const std::string& name) {
  if (cfg.tie_word_embeddings && name == "lm_head.weight") return true;
  for (const char* suffix : arch_spec(cfg.arch).harmless_extra) {
    std::string s = suffix;
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

Tensor arch_view(const ModelWeights& w, const HfTensorSpec& t) {
  const Tensor* src = nullptr;
  if (t.layer >= 0) {
    GRPO_CHECK(size_t(t.layer) < w.layers.size());
    const LayerWeights& L = w.layers[size_t(t.layer)];
    switch (t.slot) {
      case S::attn_norm: src = &L.attn_norm; break;
      case S::wqkv: src = &L.wqkv; break;
      case S::bqkv: src = &L.bqkv; break;
      case S::q_norm: src = &L.q_norm; break;
      case S::k_norm: src = &L.k_norm; break;
      case S::wo: src = &L.wo; break;
      case S::mlp_norm: src = &L.mlp_norm; break;
      case S::w_gate_up: src = &L.w_gate_up; break;
      case S::w_down: src = &L.w_down; break;
      default: GRPO_CHECK_MSG(false, "model-level slot with a layer index");
    }
  } else {
    switch (t.slot) {
      case S::embed: src = &w.embed; break;
      case S::final_norm: src = &w.final_norm; break;
      case S::lm_head: src = &w.lm_head; break;
      default: GRPO_CHECK_MSG(false, "layer slot without a layer index");
    }
  }
  GRPO_CHECK(src->defined());
  return src->slice0(t.row_begin, t.row_end);
}

}  // namespace grpo
