// RunConfig <-> TOML/JSON: strict loading, --set overrides, dumps.
// One table (fields_of) lists every scalar key with a pointer to its member,
// so loading, overriding, listing and dumping cannot disagree.
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <variant>

#include <toml++/toml.h>

#include "train/run_config.h"

namespace grpo {

namespace {

using json = nlohmann::ordered_json;
// An enum-like key: read and written by name through the value's one name table.
struct EnumRef {
  std::function<std::string()> get;                   // canonical name
  std::function<bool(const std::string&)> set;        // false: not a name of the table
  std::string allowed;                                // "a, b, c"
};
template <class E>
EnumRef enum_ref(E* p, std::span<const EnumName<E>> table) {
  return {[p, table] { return std::string(enum_name(table, *p)); },
          [p, table](const std::string& s) {
            auto v = enum_parse(table, s);
            if (v) *p = *v;
            return v.has_value();
          },
          enum_allowed(table)};
}

// model.device is a family of names ("cuda:N"), not a table; same contract as enum_ref.
EnumRef device_ref(DeviceSpec* p) {
  return {[p] { return device_spec_name(*p); },
          [p](const std::string& s) {
            auto v = device_spec_parse(s);
            if (v) *p = *v;
            return v.has_value();
          },
          kDeviceSpecAllowed};
}

using FieldPtr = std::variant<bool*, int64_t*, double*, std::string*, std::vector<std::string>*, EnumRef>;
struct Field {
  std::string key;
  FieldPtr ptr;
};

std::vector<Field> fields_of(RunConfig& c) {
  auto& d = c.data;
  auto& a = c.data.arithmetic;
  auto& r = c.rollout;
  auto& g = c.engine;
  auto& t = c.train;
  auto& e = c.eval;
  return {
      {"run.output_dir", &c.run.output_dir}, {"run.name", &c.run.name}, {"run.deterministic", &c.run.deterministic},
      {"model.path", &c.model.path}, {"model.tokenizer", &c.model.tokenizer}, {"model.dtype", enum_ref(&c.model.dtype, model_dtype_names())},
      {"model.device", device_ref(&c.model.device)},
      {"data.env", enum_ref(&d.env, env_kind_names())}, {"data.train_path", &d.train_path}, {"data.eval_path", &d.eval_path},
      {"data.prompt_field", &d.prompt_field}, {"data.answer_field", &d.answer_field},
      {"data.answer_is_solution", &d.answer_is_solution}, {"data.prompt_template", &d.prompt_template},
      {"data.use_chat_template", &d.use_chat_template}, {"data.system_prompt", &d.system_prompt},
      {"data.eval_split", enum_ref(&d.eval_split, eval_split_names())}, {"data.eval_size", &d.eval_size}, {"data.on_bad_line", enum_ref(&d.on_bad_line, bad_line_names())},
      {"data.shuffle", &d.shuffle}, {"data.seed", &d.seed},
      {"data.arithmetic.difficulty", &a.difficulty}, {"data.arithmetic.style", enum_ref(&a.style, arithmetic_style_names())},
      {"data.arithmetic.train_size", &a.train_size}, {"data.arithmetic.test_size", &a.test_size},
      {"data.arithmetic.test_permille", &a.test_permille},
      {"rollout.num_generations", &r.num_generations}, {"rollout.prompts_per_step", &r.prompts_per_step},
      {"rollout.max_new_tokens", &r.max_new_tokens}, {"rollout.temperature", &r.temperature},
      {"rollout.top_p", &r.top_p}, {"rollout.top_k", &r.top_k}, {"rollout.min_p", &r.min_p},
      {"rollout.seed", &r.seed}, {"rollout.stop", &r.stop}, {"rollout.ignore_eos", &r.ignore_eos},
      {"rollout.min_new_tokens", &r.min_new_tokens}, {"rollout.server_url", &r.server_url},
      {"rollout.server_timeout_s", &r.server_timeout_s}, {"rollout.server_max_concurrency", &r.server_max_concurrency},
      {"rollout.server_on_failure", enum_ref(&r.server_on_failure, server_on_failure_names())},
      {"engine.block_size", &g.block_size}, {"engine.max_num_seqs", &g.max_num_seqs},
      {"engine.max_num_batched_tokens", &g.max_num_batched_tokens}, {"engine.max_model_len", &g.max_model_len},
      {"engine.enable_prefix_caching", &g.enable_prefix_caching},
      {"engine.enable_chunked_prefill", &g.enable_chunked_prefill},
      {"engine.cuda_graphs", enum_ref(&g.cuda_graphs, cuda_graphs_names())},
      {"engine.cuda_graph_max_context", &g.cuda_graph_max_context},
      {"engine.kv_cache_dtype", enum_ref(&g.kv_cache_dtype, kv_cache_dtype_names())},
      {"engine.gpu_memory_utilization", &g.gpu_memory_utilization}, {"engine.kv_cache_mib", &g.kv_cache_mib},
      {"engine.speculative.method", enum_ref(&g.speculative.method, spec_method_names())},
      {"engine.speculative.draft_model", &g.speculative.draft_model},
      {"engine.speculative.num_speculative_tokens", &g.speculative.num_speculative_tokens},
      {"engine.speculative.ngram_min", &g.speculative.ngram_min},
      {"engine.speculative.ngram_max", &g.speculative.ngram_max},
      {"engine.speculative.adaptive", &g.speculative.adaptive},
      {"engine.speculative.probe_every", &g.speculative.probe_every},
      {"engine.speculative.acceptance", enum_ref(&g.speculative.acceptance, spec_acceptance_names())},
      {"engine.speculative.draft_vocab", &g.speculative.draft_vocab},
      {"engine.speculative.draft_vocab_size", &g.speculative.draft_vocab_size},
      {"train.steps", &t.steps}, {"train.lr", &t.lr}, {"train.lr_schedule", enum_ref(&t.lr_schedule, lr_schedule_names())},
      {"train.warmup_steps", &t.warmup_steps}, {"train.weight_decay", &t.weight_decay},
      {"train.weight_decay_all", &t.weight_decay_all},
      {"train.adam_beta1", &t.adam_beta1}, {"train.adam_beta2", &t.adam_beta2}, {"train.adam_eps", &t.adam_eps},
      {"train.max_grad_norm", &t.max_grad_norm}, {"train.micro_batch", &t.micro_batch},
      {"train.micro_batch_tokens", &t.micro_batch_tokens}, {"train.activation_recompute", &t.activation_recompute},
      {"train.grad_accum", &t.grad_accum}, {"train.steps_per_generation", &t.steps_per_generation},
      {"train.num_iterations", &t.num_iterations}, {"train.loss_type", enum_ref(&t.loss_type, loss_type_names())},
      {"train.importance_sampling_level", enum_ref(&t.importance_sampling_level, is_level_names())}, {"train.beta", &t.beta},
      {"train.epsilon", &t.epsilon}, {"train.epsilon_high", &t.epsilon_high},
      {"train.scale_rewards", enum_ref(&t.scale_rewards, scale_rewards_names())}, {"train.importance_sampling", enum_ref(&t.importance_sampling, is_mode_names())},
      {"train.importance_sampling_cap", &t.importance_sampling_cap},
      {"train.importance_sampling_geomean", &t.importance_sampling_geomean},
      {"train.mask_truncated_completions", &t.mask_truncated_completions}, {"train.on_policy", enum_ref(&t.on_policy, on_policy_names())},
      {"train.max_consecutive_skipped_steps", &t.max_consecutive_skipped_steps},
      {"eval.every", &e.every}, {"eval.at_start", &e.at_start}, {"eval.greedy", &e.greedy},
      {"eval.temperature", &e.temperature}, {"eval.n_prompts", &e.n_prompts}, {"eval.max_new_tokens", &e.max_new_tokens},
      {"eval.early_stopping_patience", &e.early_stopping_patience},
      {"eval.early_stopping_metric", enum_ref(&e.early_stopping_metric, early_stopping_metric_names())},
      {"eval.early_stopping_min_delta", &e.early_stopping_min_delta},
      {"tandem.enabled", &c.tandem.enabled}, {"tandem.partner", &c.tandem.partner},
      {"tandem.strategy", enum_ref(&c.tandem.strategy, tandem_strategy_names())}, {"tandem.p_trained", &c.tandem.p_trained},
      {"tandem.chunk_size", &c.tandem.chunk_size}, {"tandem.partner_weight", &c.tandem.partner_weight},
      {"tandem.seed", &c.tandem.seed}, {"tandem.eval_tandem", &c.tandem.eval_tandem},
      {"checkpoint.every", &c.checkpoint.every}, {"checkpoint.keep_last", &c.checkpoint.keep_last},
      {"checkpoint.save_final", &c.checkpoint.save_final},
      {"log.jsonl", &c.log.jsonl}, {"log.tensorboard", &c.log.tensorboard}, {"log.plot", &c.log.plot},
      {"log.plot_metrics", &c.log.plot_metrics}, {"log.every", &c.log.every}, {"log.progress", enum_ref(&c.log.progress, progress_names())},
      {"log.level", enum_ref(&c.log.level, log_level_names())},
      {"curriculum.type", enum_ref(&c.curriculum.type, curriculum_type_names())}, {"curriculum.ema_init", &c.curriculum.ema_init},
      {"curriculum.ema_decay", &c.curriculum.ema_decay}, {"curriculum.bandwidth", &c.curriculum.bandwidth},
      {"curriculum.grid_points", &c.curriculum.grid_points}, {"curriculum.n_clusters", &c.curriculum.n_clusters},
      {"curriculum.alpha", &c.curriculum.alpha}, {"curriculum.max_generations", &c.curriculum.max_generations},
      {"curriculum.report_every", &c.curriculum.report_every},
      {"server.enabled", &c.server.enabled}, {"server.host", &c.server.host}, {"server.port", &c.server.port},
      {"server.api_key", &c.server.api_key}, {"server.served_model_name", &c.server.served_model_name},
      {"server.max_body_bytes", &c.server.max_body_bytes}, {"server.max_prompt_tokens", &c.server.max_prompt_tokens},
      {"server.max_tokens_limit", &c.server.max_tokens_limit}, {"server.max_n", &c.server.max_n},
      {"server.max_queued_requests", &c.server.max_queued_requests}, {"server.bridge", &c.server.bridge},
      {"server.bridge_addr", &c.server.bridge_addr}, {"server.bridge_servers", &c.server.bridge_servers},
      {"server.bridge_bucket_mib", &c.server.bridge_bucket_mib}, {"server.bridge_on_failure", &c.server.bridge_on_failure},
      {"server.bridge_timeout_s", &c.server.bridge_timeout_s},
      {"remote.url", &c.remote.url}, {"remote.host", &c.remote.host}, {"remote.port", &c.remote.port},
      {"remote.max_queued_sequences", &c.remote.max_queued_sequences}, {"remote.max_staleness", &c.remote.max_staleness},
      {"remote.stale", enum_ref(&c.remote.stale, stale_policy_names())}, {"remote.stale_weight", &c.remote.stale_weight},
      {"remote.poll_interval", &c.remote.poll_interval}, {"remote.wait_log_every", &c.remote.wait_log_every},
      {"remote.max_wait", &c.remote.max_wait}, {"remote.wandb_group", &c.remote.wandb_group},
      {"remote.wandb_project", &c.remote.wandb_project},
      {"dist.zero_stage", &c.dist.zero_stage}, {"dist.bucket_mb", &c.dist.bucket_mb},
      {"dist.timeout_s", &c.dist.timeout_s}, {"dist.overlap_backward", &c.dist.overlap_backward},
      {"lora.enabled", &c.lora.enabled}, {"lora.r", &c.lora.r}, {"lora.alpha", &c.lora.alpha},
      {"lora.dropout", &c.lora.dropout}, {"lora.use_rslora", &c.lora.use_rslora},
      {"lora.target_modules", &c.lora.target_modules}, {"lora.seed", &c.lora.seed},
      {"lora.init_from", &c.lora.init_from},
      {"async.max_staleness", &c.async.max_staleness}, {"async.engine_threads", &c.async.engine_threads},
  };
}

const char* kind_of(const FieldPtr& p) {
  static const char* names[] = {"a boolean", "an integer", "a number", "a string", "an array of strings", "a string"};
  return names[p.index()];
}

std::string node_text(const toml::node& n) {
  if (n.is_string()) return nlohmann::json(n.as_string()->get()).dump();  // "x", as in validate() messages
  std::ostringstream s;
  n.visit([&](auto&& v) { s << v; });
  return s.str();
}

// Sets a field from a TOML node; returns an error text (without location) or "".
std::string set_field(const Field& f, const toml::node& n) {
  auto wrong = [&] { return f.key + " = " + node_text(n) + ": expected " + kind_of(f.ptr); };
  if (auto p = std::get_if<bool*>(&f.ptr)) {
    if (!n.is_boolean()) return wrong();
    **p = n.as_boolean()->get();
  } else if (auto p = std::get_if<int64_t*>(&f.ptr)) {
    if (!n.is_integer()) return wrong();
    **p = n.as_integer()->get();
  } else if (auto p = std::get_if<double*>(&f.ptr)) {
    if (!n.is_number()) return wrong();
    double v = n.is_integer() ? static_cast<double>(n.as_integer()->get()) : n.as_floating_point()->get();
    if (!std::isfinite(v)) return f.key + " = " + node_text(n) + ": must be a finite number";
    **p = v;
  } else if (auto p = std::get_if<std::string*>(&f.ptr)) {
    if (!n.is_string()) return wrong();
    **p = n.as_string()->get();
  } else if (auto e = std::get_if<EnumRef>(&f.ptr)) {
    if (!n.is_string()) return wrong() + " (one of " + e->allowed + ")";
    if (!e->set(n.as_string()->get())) return f.key + " = " + node_text(n) + ": must be one of " + e->allowed;
  } else if (auto p = std::get_if<std::vector<std::string>*>(&f.ptr)) {
    if (!n.is_array()) return wrong();
    std::vector<std::string> out;
    for (const auto& el : *n.as_array()) {
      if (!el.is_string()) return wrong();
      out.push_back(el.as_string()->get());
    }
    **p = std::move(out);
  }
  return {};
}

// Keys that moved to another section: loading the old name says where it went.
struct MovedKey {
  const char* from;
  const char* to;
};
constexpr MovedKey kMovedKeys[] = {{"rollout.kv_cache_dtype", "engine.kv_cache_dtype"}};

std::string moved_key(const std::string& key) {
  for (const auto& m : kMovedKeys)
    if (key == m.from) {
      const std::string to = m.to;
      const size_t dot = to.find('.');
      return key + " has moved to " + to + ": write it as " + to.substr(dot + 1) + " = ... in the [" +
             to.substr(0, dot) + "] section (or --set " + to + "=...)";
    }
  return {};
}

const Field* find_field(const std::vector<Field>& fs, const std::string& key) {
  for (const auto& f : fs)
    if (f.key == key) return &f;
  return nullptr;
}

// "unknown key 'x' in section [s]; valid keys: ..." (sub-tables shown as "name.*").
std::string unknown_key(const std::vector<Field>& fs, const std::string& section, const std::string& key) {
  std::vector<std::string> valid;
  for (const auto& f : fs) {
    if (f.key.rfind(section + ".", 0) != 0) continue;
    std::string rest = f.key.substr(section.size() + 1);
    size_t dot = rest.find('.');
    if (dot != std::string::npos) rest = rest.substr(0, dot) + ".*";
    if (std::find(valid.begin(), valid.end(), rest) == valid.end()) valid.push_back(rest);
  }
  std::string list;
  for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
  return "unknown key '" + key + "' in section [" + section + "]; valid keys: " + list;
}

std::string unknown_section(const std::vector<Field>& fs, const std::string& name) {
  std::vector<std::string> secs;
  for (const auto& f : fs) {
    std::string s = f.key.substr(0, f.key.find('.'));
    if (std::find(secs.begin(), secs.end(), s) == secs.end()) secs.push_back(s);
  }
  std::string list;
  for (const auto& s : secs) list += (list.empty() ? "" : ", ") + s;
  return "unknown section [" + name + "]; valid sections: " + list + ", [[reward]]";
}

std::string where(const std::string& src, const toml::node& n) {
  return src + ":" + std::to_string(n.source().begin.line) + ": ";
}

Status load_table(const std::vector<Field>& fs, const toml::table& t, const std::string& prefix, const std::string& src) {
  for (auto&& [k, node] : t) {
    std::string key = prefix + "." + std::string(k.str());
    if (node.is_table()) {
      bool has_sub = false;
      for (const auto& f : fs) has_sub |= f.key.rfind(key + ".", 0) == 0;
      if (!has_sub) return error_status(where(src, node) + unknown_key(fs, prefix, std::string(k.str())));
      GRPO_TRY(load_table(fs, *node.as_table(), key, src));
      continue;
    }
    const Field* f = find_field(fs, key);
    if (!f && !moved_key(key).empty()) return error_status(where(src, node) + moved_key(key));
    if (!f) return error_status(where(src, node) + unknown_key(fs, prefix, std::string(k.str())));
    std::string err = set_field(*f, node);
    if (!err.empty()) return error_status(where(src, node) + err);
  }
  return ok_status();
}

// An array of strings (a command's argv) or a table of strings (HTTP headers)
// as JSON; nullopt for anything else.
std::optional<nlohmann::json> strings_to_json(const toml::node& v) {
  if (const toml::array* a = v.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : *a) {
      if (!e.is_string()) return std::nullopt;
      j.push_back(e.as_string()->get());
    }
    return j;
  }
  if (const toml::table* t = v.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto&& [k, e] : *t) {
      if (!e.is_string()) return std::nullopt;
      j[std::string(k.str())] = e.as_string()->get();
    }
    return j;
  }
  return std::nullopt;
}

Status load_rewards(const toml::node& n, const std::string& src, std::vector<RewardSpec>* out) {
  if (!n.is_array_of_tables())
    return error_status(where(src, n) + "reward must be an array of tables: write each function as a [[reward]] block");
  out->clear();
  size_t i = 0;
  for (const auto& el : *n.as_array()) {
    std::string at = where(src, el) + "reward[" + std::to_string(i++) + "]";
    RewardSpec spec;
    bool named = false;
    for (auto&& [k, v] : *el.as_table()) {
      std::string key(k.str());
      if (key == "name") {
        if (!v.is_string()) return error_status(at + ".name = " + node_text(v) + ": expected a string");
        spec.name = v.as_string()->get();
        named = true;
      } else if (key == "weight") {
        if (!v.is_number()) return error_status(at + ".weight = " + node_text(v) + ": expected a number");
        spec.weight = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
      } else if (v.is_boolean()) spec.params[key] = v.as_boolean()->get();
      else if (v.is_integer()) spec.params[key] = v.as_integer()->get();
      else if (v.is_floating_point()) spec.params[key] = v.as_floating_point()->get();
      else if (v.is_string()) spec.params[key] = v.as_string()->get();
      else if (auto j = strings_to_json(v)) spec.params[key] = std::move(*j);
      else return error_status(at + "." + key + " = " + node_text(v) +
                               ": expected a number, boolean, string, array of strings or table of strings");
    }
    if (!named) return error_status(at + ": missing key 'name' (e.g. name = \"correct\")");
    auto fn = reward_make(spec);
    if (!fn.ok()) return error_status(at + ": " + fn.status().message());
    out->push_back(std::move(spec));
  }
  return ok_status();
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Parses an override value as a TOML value; nullopt if it is not valid TOML.
std::optional<toml::table> parse_value(const std::string& v) {
  try {
    return toml::parse("v = " + v);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

Status set_reward(RunConfig* cfg, const std::string& key, const std::string& val, const std::string& what) {
  size_t d1 = key.find('.'), d2 = key.find('.', d1 + 1);
  if (d2 == std::string::npos) return error_status(what + ": reward overrides are reward.<name>.<param>=value, e.g. reward.correct.weight=2");
  std::string name = key.substr(d1 + 1, d2 - d1 - 1), param = key.substr(d2 + 1);
  RewardSpec* spec = nullptr;
  for (auto& r : cfg->reward)
    if (r.name == name && !spec) spec = &r;
  const RewardInfo* info = reward_find(name);
  if (!info) return error_status(what + ": " + reward_make({name}).status().message());
  if (!spec) spec = &cfg->reward.emplace_back(RewardSpec{name, 1.0});
  auto parsed = parse_value(val);
  const toml::node* n = parsed ? parsed->get("v") : nullptr;
  if (param == "weight") {
    if (!n || !n->is_number()) return error_status(what + ": reward weight must be a number");
    spec->weight = n->is_integer() ? static_cast<double>(n->as_integer()->get()) : n->as_floating_point()->get();
    return ok_status();
  }
  for (const auto& p : info->params) {
    if (p.name != param) continue;
    if (p.type == RewardParamType::string) spec->params[param] = (n && n->is_string()) ? n->as_string()->get() : val;
    else if (p.type == RewardParamType::string_list || p.type == RewardParamType::string_table) {
      auto j = n ? strings_to_json(*n) : std::nullopt;
      if (!j) return error_status(what + ": value '" + val + "' is not a TOML " +
                                  (p.type == RewardParamType::string_list ? "array of strings, e.g. [\"python3\", \"r.py\"]"
                                                                         : "inline table of strings, e.g. {X-Key = \"v\"}"));
      spec->params[param] = std::move(*j);
    } else if (n && n->is_boolean()) spec->params[param] = n->as_boolean()->get();
    else if (n && n->is_integer()) spec->params[param] = n->as_integer()->get();
    else if (n && n->is_floating_point()) spec->params[param] = n->as_floating_point()->get();
    else return error_status(what + ": value '" + val + "' is not a number or boolean");
    auto fn = reward_make(*spec);
    if (!fn.ok()) return error_status(what + ": " + fn.status().message());
    return ok_status();
  }
  return error_status(what + ": " + reward_make({name, 1.0, {{param, 0}}}).status().message());
}

// TOML text of a scalar or array of scalars. Floats use the shortest text
// that reads back to the same double; strings use JSON escapes, which are
// valid in TOML basic strings.
std::string toml_value(const json& v) {
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_value(v[i]);
    return s + "]";
  }
  if (v.is_object()) {
    std::string s = "{";
    for (auto it = v.begin(); it != v.end(); ++it) s += std::string(it == v.begin() ? " " : ", ") + json(it.key()).dump() + " = " + toml_value(*it);
    return s + (v.empty() ? "}" : " }");
  }
  if (v.is_number_float()) {
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v.get<double>());
    std::string t(buf, res.ptr);
    if (t.find_first_of(".e") == std::string::npos) t += ".0";
    return t;
  }
  return v.dump();  // booleans, integers, strings
}

// Writes the leaves of `obj` under `header`, then its sub-tables, in declaration order.
void emit_table(const json& obj, const std::string& path, std::string* out) {
  if (!path.empty()) *out += "\n[" + path + "]\n";
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!it->is_object()) *out += it.key() + " = " + toml_value(*it) + "\n";
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (it->is_object()) emit_table(*it, path.empty() ? it.key() : path + "." + it.key(), out);
}

}  // namespace

Status run_config_set(RunConfig* cfg, const std::string& assignment) {
  size_t eq = assignment.find('=');
  std::string what = "--set " + assignment;
  if (eq == std::string::npos) return error_status(what + ": expected key=value, e.g. --set train.lr=1e-5");
  std::string key = trim(assignment.substr(0, eq)), val = trim(assignment.substr(eq + 1));
  if (key.rfind("reward.", 0) == 0) return set_reward(cfg, key, val, what);
  auto fs = fields_of(*cfg);
  const Field* f = find_field(fs, key);
  if (!f && !moved_key(key).empty()) return error_status(what + ": " + moved_key(key));
  if (!f) {
    size_t dot = key.rfind('.');
    std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
    bool known = false;
    for (const auto& x : fs) known |= !section.empty() && x.key.rfind(section + ".", 0) == 0;
    return error_status(what + ": " + (known ? unknown_key(fs, section, key.substr(dot + 1)) : unknown_section(fs, key.substr(0, key.find('.')))));
  }
  auto parsed = parse_value(val);
  const toml::node* n = parsed ? parsed->get("v") : nullptr;
  if (auto p = std::get_if<std::string*>(&f->ptr); p && !(n && n->is_string())) {
    **p = val;  // unquoted strings are taken as written
    return ok_status();
  }
  if (auto e = std::get_if<EnumRef>(&f->ptr); e && !(n && n->is_string())) {
    if (!e->set(val)) return error_status(what + ": " + key + " = \"" + val + "\": must be one of " + e->allowed);
    return ok_status();
  }
  if (auto p = std::get_if<std::vector<std::string>*>(&f->ptr); p && !(n && n->is_array())) {
    std::vector<std::string> items;
    std::stringstream ss(val);
    for (std::string item; std::getline(ss, item, ',');)
      if (!trim(item).empty()) items.push_back(trim(item));
    **p = std::move(items);
    return ok_status();
  }
  if (!n) return error_status(what + ": '" + val + "' is not " + kind_of(f->ptr));
  std::string err = set_field(*f, *n);
  if (!err.empty()) return error_status("--set " + err);
  return ok_status();
}

Result<RunConfig> run_config_parse(const std::string& text, const std::string& src,
                                   const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, src);
  } catch (const toml::parse_error& e) {
    return error_status(src + ":" + std::to_string(e.source().begin.line) + ":" + std::to_string(e.source().begin.column) +
                        ": TOML syntax error: " + std::string(e.description()));
  }
  RunConfig cfg;
  auto fs = fields_of(cfg);
  for (auto&& [k, node] : root) {
    std::string name(k.str());
    if (name == "reward") {
      GRPO_TRY(load_rewards(node, src, &cfg.reward));
      continue;
    }
    bool known = false;
    for (const auto& f : fs) known |= f.key.rfind(name + ".", 0) == 0;
    if (!known) return error_status(where(src, node) + unknown_section(fs, name));
    if (!node.is_table()) return error_status(where(src, node) + "'" + name + "' must be a section [" + name + "], not a value");
    GRPO_TRY(load_table(fs, *node.as_table(), name, src));
  }
  for (const auto& o : overrides) GRPO_TRY(run_config_set(&cfg, o));
  Status st = cfg.validate();
  if (!st.ok()) return st.with_context(src);
  return cfg;
}

Result<RunConfig> run_config_load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error_status("cannot open config file '" + path + "': check the path");
  std::ostringstream ss;
  ss << in.rdbuf();
  GRPO_ASSIGN_OR_RETURN(RunConfig cfg, run_config_parse(ss.str(), path, overrides));
  auto paths = run_config_resolve_paths(cfg);
  if (!paths.ok()) return paths.status().with_context(path);
  return cfg;
}

nlohmann::ordered_json run_config_to_json(const RunConfig& cfg) {
  RunConfig copy = cfg;  // fields_of needs mutable pointers; read only here
  json j = json::object();
  for (const auto& f : fields_of(copy)) {
    json* cur = &j;
    size_t start = 0;
    for (size_t dot; (dot = f.key.find('.', start)) != std::string::npos; start = dot + 1) cur = &(*cur)[f.key.substr(start, dot - start)];
    std::visit([&](const auto& p) {
      if constexpr (std::is_same_v<std::decay_t<decltype(p)>, EnumRef>) (*cur)[f.key.substr(start)] = p.get();
      else (*cur)[f.key.substr(start)] = *p;
    }, f.ptr);
  }
  json rewards = json::array();
  for (const auto& r : cfg.reward) {
    json e = {{"name", r.name}, {"weight", r.weight}};
    for (auto it = r.params.begin(); it != r.params.end(); ++it) e[it.key()] = it.value();
    rewards.push_back(std::move(e));
  }
  j["reward"] = std::move(rewards);
  return j;
}

std::string run_config_to_toml(const RunConfig& cfg) {
  json j = run_config_to_json(cfg);
  std::string out = "# Resolved grpo run configuration.\n";
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it->is_object()) emit_table(*it, it.key(), &out);
  for (const auto& r : j["reward"]) {
    out += "\n[[reward]]\n";
    for (auto it = r.begin(); it != r.end(); ++it) out += it.key() + " = " + toml_value(*it) + "\n";
  }
  return out;
}

std::string run_config_key_values(const std::string& key) {
  RunConfig c;
  auto fs = fields_of(c);
  const Field* f = find_field(fs, key);
  const EnumRef* e = f ? std::get_if<EnumRef>(&f->ptr) : nullptr;
  return e ? e->allowed : std::string();
}

std::vector<std::string> run_config_keys() {
  RunConfig c;
  std::vector<std::string> keys;
  for (const auto& f : fields_of(c)) keys.push_back(f.key);
  return keys;
}

}  // namespace grpo
