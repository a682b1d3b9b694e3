// LoRA adapters: layout, PEFT initialisation, PEFT files, merging, and the
// per-target forward/backward built from the linear and column-range ops.
#include "model/lora.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "kernels/columns.h"
#include "kernels/linear.h"
#include "model/arch.h"
#include "model/safetensors.h"

namespace grpo {

using nlohmann::json;

namespace {
const char* const kShort[kLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down"};
const char* const kPeft[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

std::string targets_list() {
  std::string s;
  for (int i = 0; i < kLoraTargets; ++i) s += std::string(i ? ", " : "") + kShort[i] + " (" + kPeft[i] + ")";
  return s;
}

int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
}  // namespace

Result<LoraTarget> lora_target_parse(const std::string& name) {
  for (int i = 0; i < kLoraTargets; ++i)
    if (name == kShort[i] || name == kPeft[i]) return LoraTarget(i);
  return error_status("unknown LoRA target module '" + name + "': use " + targets_list());
}

const char* lora_target_peft_name(LoraTarget t) { return kPeft[int(t)]; }

float LoraConfig::scaling() const {
  return use_rslora ? alpha / std::sqrt(float(r)) : alpha / float(r);
}

bool LoraConfig::has(LoraTarget t) const {
  for (auto x : targets)
    if (x == t) return true;
  return false;
}

Status LoraConfig::validate() const {
  if (r < 1) return error_status("lora r = " + std::to_string(r) + ": the rank must be >= 1");
  if (!(alpha > 0.f) || !std::isfinite(alpha)) return error_status("lora alpha must be a finite number > 0");
  if (!(dropout >= 0.f && dropout < 1.f)) return error_status("lora dropout must be in [0, 1)");
  if (targets.empty()) return error_status("lora target_modules is empty: name at least one of " + targets_list());
  std::set<int> seen;
  for (auto t : targets)
    if (!seen.insert(int(t)).second)
      return error_status(std::string("lora target_modules lists '") + kShort[int(t)] + "' twice");
  return ok_status();
}

LoraGeom lora_geom(const ModelConfig& c, LoraTarget t) {
  const int64_t C = c.hidden_size, F = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
  switch (t) {
    case LoraTarget::q: return {C, q, 0};
    case LoraTarget::k: return {C, kv, q};
    case LoraTarget::v: return {C, kv, q + kv};
    case LoraTarget::o: return {q, C, 0};
    case LoraTarget::gate: return {C, F, 0};
    case LoraTarget::up: return {C, F, F};
    case LoraTarget::down: return {F, C, 0};
  }
  return {};
}

int64_t lora_numel(const ModelConfig& mc, const LoraConfig& lc) {
  int64_t n = 0;
  for (int l = 0; l < mc.n_layers; ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      if (!lc.has(LoraTarget(i))) continue;
      const LoraGeom g = lora_geom(mc, LoraTarget(i));
      n += pad16(lc.r * g.in) + pad16(g.out * lc.r);
    }
  return n;
}

void lora_bind(LoraWeights& w, const ModelConfig& mc, const LoraConfig& lc, Tensor arena) {
  GRPO_CHECK(arena.numel() >= lora_numel(mc, lc));
  w.model = mc;
  w.cfg = lc;
  w.dtype = arena.dtype;
  w.device = arena.device;
  w.arena = arena;
  w.scaling = lc.scaling();
  w.layers.assign(size_t(mc.n_layers), {});
  const size_t es = dtype_size(arena.dtype);
  int64_t off = 0;
  auto take = [&](std::vector<int64_t> shape) {
    Tensor t = tensor_borrow(static_cast<char*>(arena.data) + size_t(off) * es, arena.dtype, arena.device, shape);
    t.owner = arena.owner;
    off += pad16(shape[0] * shape[1]);
    return t;
  };
  for (int l = 0; l < mc.n_layers; ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      if (!lc.has(LoraTarget(i))) continue;
      const LoraGeom g = lora_geom(mc, LoraTarget(i));
      LoraPair& p = w.layers[size_t(l)][size_t(i)];
      p.A = take({lc.r, g.in});
      p.B = take({g.out, lc.r});
    }
}

LoraWeights lora_allocate(const ModelConfig& mc, const LoraConfig& lc, Device dev, DType dt) {
  LoraWeights w;
  lora_bind(w, mc, lc, tensor_zeros(dev, dt, {std::max<int64_t>(lora_numel(mc, lc), 1)}));
  return w;
}

std::vector<std::pair<std::string, Tensor*>> LoraWeights::params() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t l = 0; l < layers.size(); ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      LoraPair& p = layers[l][size_t(i)];
      if (p.A.empty()) continue;
      const std::string pre = "layers." + std::to_string(l) + "." + kShort[i] + ".";
      out.emplace_back(pre + "A", &p.A);
      out.emplace_back(pre + "B", &p.B);
    }
  return out;
}

void lora_init(LoraWeights& w, uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (size_t l = 0; l < w.layers.size(); ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      LoraPair& p = w.layers[l][size_t(i)];
      if (p.A.empty()) continue;
      const double bound = 1.0 / std::sqrt(double(p.A.shape[1]));
      std::uniform_real_distribution<double> u(-bound, bound);
      std::vector<float> a(size_t(p.A.numel()));
      for (auto& x : a) x = float(u(gen));
      Tensor src = tensor_from_f32(Device::cpu, DType::f32, a, {p.A.shape[0], p.A.shape[1]});
      tensor_copy_convert(p.A, src);
      tensor_fill_zero(p.B);
    }
}

std::string lora_peft_name(const ModelConfig& mc, int layer, LoraTarget t, bool is_b) {
  static const WeightSlot slot[kLoraTargets] = {WeightSlot::wqkv, WeightSlot::wqkv, WeightSlot::wqkv, WeightSlot::wo,
                                                WeightSlot::w_gate_up, WeightSlot::w_gate_up, WeightSlot::w_down};
  static const WeightPart part[kLoraTargets] = {WeightPart::q, WeightPart::k, WeightPart::v, WeightPart::whole,
                                                WeightPart::gate, WeightPart::up, WeightPart::whole};
  for (const ArchWeightName& n : arch_spec(mc.arch).names) {
    if (!n.per_layer || n.slot != slot[int(t)] || n.part != part[int(t)]) continue;
    std::string s = n.hf_name;
    const auto i = s.find("{i}");
    GRPO_CHECK(i != std::string::npos);
    s.replace(i, 3, std::to_string(layer));
    const std::string suffix = ".weight";
    GRPO_CHECK(s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0);
    s.resize(s.size() - suffix.size());
    return "base_model.model." + s + (is_b ? ".lora_B.weight" : ".lora_A.weight");
  }
  GRPO_CHECK_MSG(false, "lora_peft_name: the architecture table has no entry for this projection");
  return {};
}

Status lora_save(const std::string& dir, const LoraWeights& w) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return error_status("cannot create adapter directory " + dir + ": " + ec.message());
  json targets = json::array();
  for (auto t : w.cfg.targets) targets.push_back(kPeft[int(t)]);
  // PEFT's LoraConfig field names; values we do not support are written as PEFT's defaults.
  json c = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"base_model_name_or_path", w.cfg.base_model},
            {"revision", nullptr},
            {"inference_mode", true},
            {"r", w.cfg.r},
            {"lora_alpha", w.cfg.alpha},
            {"lora_dropout", w.cfg.dropout},
            {"target_modules", targets},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"modules_to_save", nullptr},
            {"init_lora_weights", true},
            {"layers_to_transform", nullptr},
            {"layers_pattern", nullptr},
            {"rank_pattern", json::object()},
            {"alpha_pattern", json::object()},
            {"use_rslora", w.cfg.use_rslora},
            {"use_dora", false},
            {"layer_replication", nullptr},
            {"megatron_config", nullptr},
            {"megatron_core", "megatron.core"},
            {"loftq_config", json::object()}};
  std::vector<SafetensorsWriteItem> items;
  for (int l = 0; l < w.model.n_layers; ++l)
    for (auto t : w.cfg.targets) {
      const LoraPair& p = w.pair(l, t);
      items.push_back({lora_peft_name(w.model, l, t, false), p.A, DType::f32, {}});
      items.push_back({lora_peft_name(w.model, l, t, true), p.B, DType::f32, {}});
    }
  GRPO_TRY(safetensors_write(dir + "/adapter_model.safetensors", items, {{"format", "pt"}}));
  return write_file_atomic(dir + "/adapter_config.json", c.dump(2) + "\n");
}

namespace {
Result<LoraConfig> parse_adapter_config(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status().with_context("reading the LoRA adapter (a PEFT adapter directory holds adapter_config.json)");
  json j;
  try {
    j = json::parse(text.value());
  } catch (const std::exception& e) {
    return error_status(path + ": invalid JSON: " + e.what());
  }
  auto bad = [&](const std::string& m) { return error_status(path + ": " + m); };
  if (!j.is_object()) return bad("expected a JSON object");
  if (j.value("peft_type", std::string()) != "LORA")
    return bad("peft_type is '" + j.value("peft_type", std::string()) + "'; only LORA adapters are supported");
  LoraConfig c;
  c.enabled = true;
  try {
    if (!j.contains("r") || !j["r"].is_number_integer()) return bad("'r' (the rank) is missing or not an integer");
    c.r = j["r"].get<int>();
    c.alpha = j.contains("lora_alpha") ? j["lora_alpha"].get<float>() : 8.f;  // PEFT's default
    c.dropout = j.contains("lora_dropout") && !j["lora_dropout"].is_null() ? j["lora_dropout"].get<float>() : 0.f;
    c.use_rslora = j.value("use_rslora", false);
    c.base_model = j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string()
                       ? j["base_model_name_or_path"].get<std::string>()
                       : "";
    if (j.value("use_dora", false)) return bad("use_dora = true (DoRA) is not supported");
    if (j.contains("bias") && j["bias"] != "none") return bad("bias = " + j["bias"].dump() + " is not supported (need \"none\")");
    if (j.value("fan_in_fan_out", false)) return bad("fan_in_fan_out = true is not supported");
    for (const char* k : {"rank_pattern", "alpha_pattern"})
      if (j.contains(k) && !j[k].is_null() && !j[k].empty())
        return bad(std::string(k) + " is not empty: per-module ranks/alphas are not supported");
    for (const char* k : {"layers_to_transform", "modules_to_save", "layer_replication"})
      if (j.contains(k) && !j[k].is_null()) return bad(std::string(k) + " is set; adapters must cover every layer and no extra modules");
    if (!j.contains("target_modules") || !j["target_modules"].is_array())
      return bad("target_modules must be a list of module names (regular expressions are not supported)");
    c.targets.clear();
    for (const auto& t : j["target_modules"]) {
      if (!t.is_string()) return bad("target_modules holds a non-string entry");
      auto p = lora_target_parse(t.get<std::string>());
      if (!p.ok()) return p.status().with_context(path);
      c.targets.push_back(p.value());
    }
  } catch (const std::exception& e) {
    return bad(std::string("a field has the wrong type: ") + e.what());
  }
  std::sort(c.targets.begin(), c.targets.end());  // PEFT stores a set; our layout uses target order
  c.targets.erase(std::unique(c.targets.begin(), c.targets.end()), c.targets.end());
  GRPO_TRY(c.validate().with_context(path));
  return c;
}
}  // namespace

Result<LoraWeights> lora_load(const std::string& dir, const ModelConfig& mc, Device dev, DType dt) {
  auto cfg = parse_adapter_config(dir + "/adapter_config.json");
  if (!cfg.ok()) return cfg.status();
  const std::string path = dir + "/adapter_model.safetensors";
  auto file = SafetensorsFile::open(path);
  if (!file.ok())
    return file.status().with_context("reading the LoRA adapter (PEFT writes adapter_model.safetensors)");
  LoraWeights host = lora_allocate(mc, cfg.value(), Device::cpu, DType::f32);
  std::set<std::string> expected;
  for (int l = 0; l < mc.n_layers; ++l)
    for (auto t : host.cfg.targets)
      for (bool is_b : {false, true}) {
        const std::string name = lora_peft_name(mc, l, t, is_b);
        expected.insert(name);
        Tensor& dst = is_b ? host.layers[size_t(l)][size_t(t)].B : host.layers[size_t(l)][size_t(t)].A;
        const SafetensorsEntry* e = file.value().find(name);
        if (!e) return error_status(path + ": tensor " + name + " is missing (target_modules names " +
                                    lora_target_peft_name(t) + "; is the adapter for this base model?)");
        if (e->shape != std::vector<int64_t>{dst.shape[0], dst.shape[1]})
          return error_status(path + ": tensor " + name + " has shape [" +
                              (e->shape.size() == 2 ? std::to_string(e->shape[0]) + ", " + std::to_string(e->shape[1])
                                                    : std::string("rank ") + std::to_string(e->shape.size())) +
                              "], expected [" + std::to_string(dst.shape[0]) + ", " + std::to_string(dst.shape[1]) +
                              "] for this base model and r");
        auto src = file.value().tensor_as(name, DType::f32);
        if (!src.ok()) return src.status();
        tensor_copy(dst, src.value());
      }
  for (const auto& e : file.value().entries())
    if (!expected.count(e.name))
      return error_status(path + ": unexpected tensor " + e.name +
                          " (only lora_A/lora_B of the listed target_modules are supported)");
  if (dev == Device::cpu && dt == DType::f32) return host;
  LoraWeights out = lora_allocate(mc, host.cfg, dev, dt);
  tensor_copy_convert(out.arena, host.arena);
  return out;
}

Status lora_load_into(LoraWeights& dst, const std::string& dir) {
  auto l = lora_load(dir, dst.model, Device::cpu, DType::f32);
  if (!l.ok()) return l.status();
  const LoraConfig& c = l.value().cfg;
  auto names = [](const LoraConfig& x) {
    std::string s;
    for (auto t : x.targets) s += std::string(s.empty() ? "" : ",") + kShort[int(t)];
    return s;
  };
  if (c.r != dst.cfg.r || c.targets != dst.cfg.targets)
    return error_status(dir + ": adapter r=" + std::to_string(c.r) + " targets " + names(c) +
                        " does not fit the loaded slot (r=" + std::to_string(dst.cfg.r) + " targets " + names(dst.cfg) +
                        "); a slot keeps its shapes: load this adapter into a new slot");
  if (l.value().scaling != dst.scaling)
    return error_status(dir + ": adapter scaling " + std::to_string(l.value().scaling) + " differs from the slot's " +
                        std::to_string(dst.scaling) + " (lora_alpha / r or use_rslora changed); load it into a new slot");
  tensor_copy_convert(dst.arena, l.value().arena);
  dst.cfg.base_model = c.base_model;
  return ok_status();
}

void lora_merge_into(ModelWeights& base, const LoraWeights& w) {
  const ModelConfig& mc = base.config;
  GRPO_CHECK(int(w.layers.size()) == mc.n_layers);
  const int64_t r = w.cfg.r;
  for (int l = 0; l < mc.n_layers; ++l) {
    LayerWeights& L = base.layers[size_t(l)];
    for (auto t : w.cfg.targets) {
      Tensor* slot = t == LoraTarget::o ? &L.wo : t == LoraTarget::down ? &L.w_down
                     : (t == LoraTarget::gate || t == LoraTarget::up) ? &L.w_gate_up : &L.wqkv;
      const LoraGeom g = lora_geom(mc, t);
      Tensor rows = slot->slice0(g.col0, g.col0 + g.out);  // the HF projection's rows of the fused weight
      std::vector<float> W = tensor_to_f32(rows);
      const std::vector<float> A = tensor_to_f32(w.pair(l, t).A), B = tensor_to_f32(w.pair(l, t).B);
      for (int64_t i = 0; i < g.out; ++i)
        for (int64_t j = 0; j < g.in; ++j) {
          double s = 0;
          for (int64_t k = 0; k < r; ++k) s += double(B[size_t(i * r + k)]) * double(A[size_t(k * g.in + j)]);
          W[size_t(i * g.in + j)] += float(double(w.scaling) * s);
        }
      Tensor src = tensor_from_f32(Device::cpu, DType::f32, W, {g.out, g.in});
      tensor_copy_convert(rows, src);
    }
  }
}

void lora_target_forward(Context& ctx, const LoraPair& p, const LoraGeom& g, float scaling, const Tensor& x,
                         Tensor& out_wide, Tensor& h, Tensor& tmp) {
  linear_forward(ctx, h, x, p.A, nullptr, false);
  linear_forward(ctx, tmp, h, p.B, nullptr, false);
  columns_add(ctx, out_wide, tmp, g.col0, scaling);
}

void lora_target_backward(Context& ctx, const LoraPair& p, LoraPair& grad, const LoraGeom& g, float scaling,
                          const Tensor& dout_wide, const Tensor& x, const Tensor& h, Tensor& dx, Tensor& dy,
                          Tensor& dh) {
  // dy = scaling·∂L/∂y_target, so that both products below carry the scaling once.
  columns_copy(ctx, dy, dout_wide, g.col0, scaling);
  linear_backward(ctx, &dh, &grad.B, nullptr, dy, h, p.B, false);
  linear_backward(ctx, &dx, &grad.A, nullptr, dh, x, p.A, true);
}

}  // namespace grpo
