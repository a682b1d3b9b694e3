// The Atropos trajectory API state and batcher (see trajectory_store.h).
#include "env/trajectory_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>

namespace grpo {

using json = nlohmann::json;

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiReply bad_request(const std::string& msg) {
  ApiReply r;
  r.status = 400;
  r.body = json{{"status", "error"}, {"message", msg}};
  return r;
}

std::string seq_name(const char* field, size_t i) { return std::string(field) + "[" + std::to_string(i) + "]"; }

// A list of lists of numbers, one per sequence, each as long as tokens[i].
Status check_per_token(const json& v, const char* field, const json& tokens) {
  if (v.is_null()) return ok_status();
  if (!v.is_array() || v.size() != tokens.size())
    return error_status(std::string(field) + ": must be a list with one list per sequence (" +
                        std::to_string(tokens.size()) + "), or null");
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_array() || v[i].size() != tokens[i].size())
      return error_status(seq_name(field, i) + ": must be a list of " + std::to_string(tokens[i].size()) +
                          " numbers, aligned with tokens[" + std::to_string(i) + "]");
    for (const auto& x : v[i])
      if (!x.is_number()) return error_status(seq_name(field, i) + ": holds a non-numeric value " + x.dump());
  }
  return ok_status();
}

int64_t group_len(const json& g) { return int64_t(g["tokens"].size()); }

int64_t env_of(const json& g) {
  const json& e = g["env_id"];
  return e.is_number_integer() ? e.get<int64_t>() : -1;
}

Result<int64_t> int_field(const json& body, const char* key, bool required, int64_t dflt = 0) {
  if (!body.is_object()) return error_status("the body must be a JSON object");
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) {
    if (required) return error_status(std::string("missing field '") + key + "'");
    return dflt;
  }
  if (!it->is_number_integer()) return error_status(std::string("field '") + key + "' must be an integer, got " + it->dump());
  return it->get<int64_t>();
}

Result<std::string> str_field(const json& body, const char* key, bool required) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) {
    if (required) return error_status(std::string("missing field '") + key + "'");
    return std::string();
  }
  if (!it->is_string()) return error_status(std::string("field '") + key + "' must be a string, got " + it->dump());
  return it->get<std::string>();
}

}  // namespace

Result<json> scored_data_normalize(const json& in) {
  if (!in.is_object()) return error_status("a scored group must be a JSON object, got " + std::string(in.type_name()));
  for (const char* k : {"tokens", "masks", "scores"})
    if (!in.contains(k) || in[k].is_null()) return error_status(std::string("missing field '") + k + "'");
  const json& tokens = in["tokens"];
  const json& masks = in["masks"];
  const json& scores = in["scores"];
  if (!tokens.is_array() || tokens.empty()) return error_status("tokens: must be a non-empty list of token-id lists");
  if (!masks.is_array() || masks.size() != tokens.size())
    return error_status("masks: must hold one list per sequence (" + std::to_string(tokens.size()) + "), got " +
                        (masks.is_array() ? std::to_string(masks.size()) : std::string(masks.type_name())));
  if (!scores.is_array() || scores.size() != tokens.size())
    return error_status("scores: must hold one number per sequence (" + std::to_string(tokens.size()) + "), got " +
                        (scores.is_array() ? std::to_string(scores.size()) : std::string(scores.type_name())));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_array() || tokens[i].empty()) return error_status(seq_name("tokens", i) + ": must be a non-empty list of token ids");
    for (const auto& t : tokens[i])
      if (!t.is_number_integer()) return error_status(seq_name("tokens", i) + ": holds a non-integer token " + t.dump());
    if (!masks[i].is_array() || masks[i].size() != tokens[i].size())
      return error_status(seq_name("masks", i) + ": must have as many entries as tokens[" + std::to_string(i) + "] (" +
                          std::to_string(tokens[i].size()) + "), got " +
                          (masks[i].is_array() ? std::to_string(masks[i].size()) : std::string(masks[i].type_name())));
    for (const auto& m : masks[i])
      if (!m.is_number_integer()) return error_status(seq_name("masks", i) + ": holds a non-integer entry " + m.dump());
    if (!scores[i].is_number() || !std::isfinite(scores[i].get<double>()))
      return error_status(seq_name("scores", i) + ": must be a finite number, got " + scores[i].dump());
  }
  for (const char* k : {"advantages", "ref_logprobs", "inference_logprobs"})
    GRPO_TRY(check_per_token(in.value(k, json()), k, tokens));
  const json messages = in.value("messages", json());
  if (!messages.is_null()) {
    if (!messages.is_array()) return error_status("messages: must be a list of message lists, or null");
    for (size_t i = 0; i < messages.size(); ++i) {
      if (!messages[i].is_array()) return error_status(seq_name("messages", i) + ": must be a list of messages");
      for (const auto& msg : messages[i])
        if (!msg.is_object() || !msg.contains("role") || !msg.contains("content"))
          return error_status(seq_name("messages", i) + ": every message must have 'role' and 'content' fields");
    }
  }
  const json overrides = in.value("overrides", json());
  if (!overrides.is_null()) {
    if (!overrides.is_array()) return error_status("overrides: must be a list of objects, or null");
    for (size_t i = 0; i < overrides.size(); ++i)
      if (!overrides[i].is_object()) return error_status(seq_name("overrides", i) + ": must be an object");
  }
  for (const char* k : {"generation_params", "group_overrides"}) {
    const json v = in.value(k, json());
    if (!v.is_null() && !v.is_object()) return error_status(std::string(k) + ": must be an object, or null");
  }
  const json env_id = in.value("env_id", json());
  if (!env_id.is_null() && !env_id.is_number_integer())
    return error_status("env_id: must be an integer, or null; got " + env_id.dump());
  json out = json::object();
  for (const char* k : {"tokens", "masks", "scores", "advantages", "ref_logprobs", "messages", "generation_params",
                        "inference_logprobs", "overrides", "group_overrides", "images", "env_id"})
    out[k] = in.value(k, json());
  return out;
}

std::vector<size_t> groups_summing_to(const std::vector<int64_t>& sizes, int64_t target) {
  if (sizes.empty() || target <= 0) return {};
  std::vector<size_t> idx;
  int64_t sum = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sum + sizes[i] <= target) {
      idx.push_back(i);
      sum += sizes[i];
      if (sum == target) return idx;
    }
  }
  // Subset sum over all groups; walking back from the last group and taking a
  // group whenever the rest stays reachable from the earlier ones.
  const size_t n = sizes.size();
  const size_t T = size_t(target);
  std::vector<std::vector<char>> can(n + 1, std::vector<char>(T + 1, 0));
  can[0][0] = 1;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 0; j <= T; ++j) {
      can[i][j] = can[i - 1][j];
      const int64_t s = sizes[i - 1];
      if (!can[i][j] && s >= 0 && j >= size_t(s)) can[i][j] = can[i - 1][j - size_t(s)];
    }
  if (!can[n][T]) return {};
  idx.clear();
  size_t j = T;
  for (size_t i = n; i > 0; --i) {
    const int64_t s = sizes[i - 1];
    if (s >= 0 && j >= size_t(s) && can[i - 1][j - size_t(s)]) {
      idx.push_back(i - 1);
      j -= size_t(s);
    }
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

namespace {

// Queue indices that belong to complete packs (see batch_select), in queue order,
// with the pack membership decided per (env, size) when per_env.
std::vector<size_t> packable(const std::vector<int64_t>& sizes, const std::vector<int64_t>& env_ids, int64_t max_size,
                             bool per_env) {
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> open;
  std::vector<size_t> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (per_env && env_ids[i] < 0) continue;  // Atropos's allocation path skips groups without env_id
    auto& v = open[{per_env ? env_ids[i] : 0, sizes[i]}];
    v.push_back(i);
    if (int64_t(v.size()) * sizes[i] == max_size) {
      out.insert(out.end(), v.begin(), v.end());
      v.clear();
    }
  }
  return out;
}

}  // namespace

std::vector<size_t> batch_select(const std::vector<int64_t>& sizes, const std::vector<int64_t>& env_ids,
                                 int64_t batch_size, const std::vector<BatchEnv>& envs) {
  if (sizes.empty() || batch_size <= 0) return {};
  int64_t max_size = 0, total = 0;
  for (int64_t s : sizes) {
    max_size = std::max(max_size, s);
    total += s;
  }
  std::map<int64_t, double> mins;
  for (const auto& e : envs)
    if (e.connected && e.min_batch_allocation) mins[e.id] = *e.min_batch_allocation;

  if (mins.empty()) {
    if (total < batch_size) return {};
    // Packs complete in queue order; the batch is the first packs that reach batch_size.
    std::vector<size_t> out;
    int64_t run = 0;
    for (size_t i : packable(sizes, env_ids, max_size, false)) {
      out.push_back(i);
      run += sizes[i];
      if (run == batch_size) return out;
      if (run > batch_size) return {};
    }
    return {};
  }

  const std::vector<size_t> packs = packable(sizes, env_ids, max_size, true);
  std::map<int64_t, std::vector<size_t>> packs_by_env;
  std::set<int64_t> envs_with_items;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (env_ids[i] >= 0) envs_with_items.insert(env_ids[i]);
  for (size_t i : packs) packs_by_env[env_ids[i]].push_back(i);
  // Packs were appended in completion order; take each env's in queue order.
  for (auto& [e, v] : packs_by_env) std::sort(v.begin(), v.end());

  std::map<int64_t, int64_t> need;
  int64_t total_min = 0;
  for (const auto& [e, frac] : mins) {
    const int64_t m = int64_t(double(batch_size) * frac);
    if (m <= 0) continue;
    if (!envs_with_items.count(e) || packs_by_env[e].empty()) return {};
    need[e] = m;
    total_min += m;
  }
  if (total_min > batch_size) {
    const double scale = double(batch_size) / double(total_min);
    for (auto& [e, m] : need) {
      int64_t smallest = INT64_MAX;
      for (size_t i : packs_by_env[e]) smallest = std::min(smallest, sizes[i]);
      m = std::max(smallest, int64_t(double(m) * scale));
    }
  }
  std::vector<size_t> out;
  std::set<size_t> taken;
  int64_t run = 0;
  for (const auto& [e, m] : need) {
    int64_t got = 0;
    for (size_t i : packs_by_env[e]) {
      if (got >= m) break;
      if (run + sizes[i] <= batch_size) {
        out.push_back(i);
        taken.insert(i);
        got += sizes[i];
        run += sizes[i];
      }
    }
  }
  if (run < batch_size) {
    std::vector<size_t> rest;
    for (size_t i : packs)
      if (!taken.count(i)) rest.push_back(i);
    std::sort(rest.begin(), rest.end());
    for (size_t i : rest) {
      if (run + sizes[i] <= batch_size) {
        out.push_back(i);
        run += sizes[i];
      }
      if (run == batch_size) break;
    }
  }
  if (run != batch_size) return {};
  return out;
}

TrajectoryStore::TrajectoryStore(TrajectoryStoreOptions opt) : opt_(opt) {}

void TrajectoryStore::clear_locked() {
  registered_ = false;
  started_ = false;
  has_wandb_ = false;
  wandb_group_.clear();
  wandb_project_.clear();
  batch_size_ = -1;
  max_token_len_ = -1;
  num_steps_ = -1;
  step_ = 0;
  checkpoint_dir_.clear();
  save_checkpoint_interval_ = 0;
  requesters_.clear();
  envs_.clear();
  queue_.clear();
  buffer_.clear();
  curr_batch_.clear();
  latest_.reset();
}

bool TrajectoryStore::trainer_registered() const {
  std::lock_guard<std::mutex> lk(mu_);
  return registered_;
}

ApiReply TrajectoryStore::register_trainer(const json& body) {
  if (!body.is_object()) return bad_request("POST /register: the body must be a JSON object");
  auto bs = int_field(body, "batch_size", true);
  auto mtl = int_field(body, "max_token_len", true);
  auto sci = int_field(body, "save_checkpoint_interval", true);
  auto ss = int_field(body, "starting_step", true);
  auto ns = int_field(body, "num_steps", true);
  auto cd = str_field(body, "checkpoint_dir", true);
  auto wg = str_field(body, "wandb_group", false);
  auto wp = str_field(body, "wandb_project", false);
  for (const Status* s : {&bs.status(), &mtl.status(), &sci.status(), &ss.status(), &ns.status(), &cd.status(),
                          &wg.status(), &wp.status()})
    if (!s->ok()) return bad_request("POST /register: " + s->message());
  if (bs.value() <= 0) return bad_request("POST /register: batch_size must be > 0, got " + std::to_string(bs.value()));
  std::lock_guard<std::mutex> lk(mu_);
  if (!registered_) {
    registered_ = true;
    wandb_group_ = wg.value();
    wandb_project_ = wp.value();
    has_wandb_ = true;
    batch_size_ = bs.value();
    max_token_len_ = mtl.value();
    step_ = ss.value();
    checkpoint_dir_ = cd.value();
    save_checkpoint_interval_ = sci.value();
    num_steps_ = ns.value();
    curr_batch_.clear();
    started_ = false;
  }
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  requesters_.push_back(rng());
  return ApiReply{200, json{{"uuid", requesters_.back()}}, "", 0};
}

ApiReply TrajectoryStore::register_env(const json& body) {
  if (!body.is_object()) return bad_request("POST /register-env: the body must be a JSON object");
  auto mtl = int_field(body, "max_token_length", true);
  auto gs = int_field(body, "group_size", true);
  auto name = str_field(body, "desired_name", true);
  if (!mtl.ok()) return bad_request("POST /register-env: " + mtl.status().message());
  if (!gs.ok()) return bad_request("POST /register-env: " + gs.status().message());
  if (!name.ok()) return bad_request("POST /register-env: " + name.status().message());
  if (gs.value() <= 0) return bad_request("POST /register-env: group_size must be > 0");
  if (!body.contains("weight")) return bad_request("POST /register-env: missing field 'weight'");
  const json& w = body["weight"];
  if (!w.is_null() && !w.is_number()) return bad_request("POST /register-env: field 'weight' must be a number");
  std::optional<double> min_alloc;
  if (body.contains("min_batch_allocation") && !body["min_batch_allocation"].is_null()) {
    const json& m = body["min_batch_allocation"];
    if (!m.is_number()) return bad_request("POST /register-env: min_batch_allocation must be a number in [0, 1] or null");
    min_alloc = m.get<double>();
    if (!(*min_alloc >= 0 && *min_alloc <= 1))
      return bad_request("POST /register-env: min_batch_allocation must be in [0, 1], got " + m.dump());
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!started_) return ApiReply{200, json{{"status", "wait for trainer to start"}}, "", 0};
  Env e;
  e.max_context_len = mtl.value();
  e.weight = w.is_null() ? 1.0 : w.get<double>();
  e.desired_name = name.value();
  int same = 0;
  for (const auto& x : envs_) same += x.desired_name == e.desired_name;
  e.real_name = e.desired_name + "_" + std::to_string(same);
  e.registered_id = int64_t(envs_.size());
  e.last_update = wall_now();
  e.min_batch_allocation = min_alloc;
  e.group_size = gs.value();
  envs_.push_back(e);
  buffer_.resize(envs_.size());
  ctr_.envs_registered = int64_t(envs_.size());
  return ApiReply{200,
                  json{{"status", "success"},
                       {"env_id", e.registered_id},
                       {"wandb_name", e.real_name},
                       {"checkpoint_dir", checkpoint_dir_},
                       {"starting_step", step_},
                       {"checkpoint_interval", save_checkpoint_interval_},
                       {"num_steps", num_steps_}},
                  "", 0};
}

ApiReply TrajectoryStore::disconnect_env(const json& body) {
  auto id = int_field(body, "env_id", true);
  if (!id.ok()) return bad_request("POST /disconnect-env: " + id.status().message());
  std::lock_guard<std::mutex> lk(mu_);
  if (id.value() < 0 || id.value() >= int64_t(envs_.size()))
    return ApiReply{200, json{{"status", "failure"}, {"error", "no environment with env_id " + std::to_string(id.value())}}, "", 0};
  envs_[size_t(id.value())].connected = false;
  return ApiReply{200, json{{"status", "success"}}, "", 0};
}

ApiReply TrajectoryStore::info() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ApiReply{200, json{{"batch_size", batch_size_}, {"max_token_len", max_token_len_}}, "", 0};
}

ApiReply TrajectoryStore::wandb_info() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (!has_wandb_) return ApiReply{200, json{{"group", nullptr}, {"project", nullptr}, {"zmq_port", nullptr}}, "", 0};
  // No ZMQ log sidecar here: environments that find zmq_port null skip it.
  return ApiReply{200, json{{"group", wandb_group_}, {"project", wandb_project_}, {"zmq_port", nullptr}}, "", 0};
}

ApiReply TrajectoryStore::batch() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!registered_)
    return ApiReply{200, json{{"status", "error"}, {"message", "no trainer registered: POST /register first"}, {"batch", nullptr}}, "", 0};
  started_ = true;
  if (!curr_batch_.empty()) {
    json b = std::move(curr_batch_.back());
    curr_batch_.pop_back();
    return ApiReply{200, json{{"batch", std::move(b)}}, "", 0};
  }
  std::vector<BatchEnv> envs;
  for (const auto& e : envs_) envs.push_back(BatchEnv{e.registered_id, e.connected, e.min_batch_allocation});
  int64_t formed = 0;
  for (;;) {
    std::vector<int64_t> sizes, ids;
    for (const auto& g : queue_) {
      sizes.push_back(group_len(g));
      ids.push_back(env_of(g));
    }
    std::vector<size_t> pick = batch_select(sizes, ids, batch_size_, envs);
    if (pick.empty()) break;
    json b = json::array();
    for (size_t i : pick) b.push_back(std::move(queue_[i]));
    std::set<size_t> gone(pick.begin(), pick.end());
    std::vector<json> rest;
    for (size_t i = 0; i < queue_.size(); ++i)
      if (!gone.count(i)) rest.push_back(std::move(queue_[i]));
    queue_ = std::move(rest);
    curr_batch_.push_back(std::move(b));
    ++formed;
  }
  if (formed == 0) return ApiReply{200, json{{"batch", nullptr}}, "", 0};
  step_ += formed;
  ctr_.batches_formed += formed;
  json b = std::move(curr_batch_.back());
  curr_batch_.pop_back();
  return ApiReply{200, json{{"batch", std::move(b)}}, "", 0};
}

int64_t TrajectoryStore::pending_sequences_locked() const {
  int64_t n = 0;
  for (const auto& g : queue_) n += group_len(g);
  for (const auto& v : buffer_)
    for (const auto& g : v) n += group_len(g);
  for (const auto& b : curr_batch_)
    for (const auto& g : b) n += group_len(g);
  return n;
}

json TrajectoryStore::accept_locked(json g) {
  const int64_t env = env_of(g);
  const int64_t n = group_len(g);
  ctr_.groups_received += 1;
  ctr_.sequences_received += n;
  ctr_.last_post_time = wall_now();
  if (env >= 0 && env < int64_t(envs_.size())) {
    Env& e = envs_[size_t(env)];
    e.last_update = ctr_.last_post_time;
    if (n != e.group_size) {
      auto& buf = buffer_[size_t(env)];
      buf.push_back(std::move(g));
      std::vector<int64_t> sizes;
      for (const auto& x : buf) sizes.push_back(group_len(x));
      std::vector<size_t> idx = groups_summing_to(sizes, e.group_size);
      if (!idx.empty()) {
        std::set<size_t> gone(idx.begin(), idx.end());
        std::vector<json> keep;
        for (size_t i = 0; i < buf.size(); ++i) {
          if (gone.count(i)) {
            latest_ = buf[i];
            queue_.push_back(std::move(buf[i]));
          } else {
            keep.push_back(std::move(buf[i]));
          }
        }
        buf = std::move(keep);
      }
      int64_t in_buf = 0;
      for (const auto& x : buf) in_buf += group_len(x);
      return json{{"status", "buffered"}, {"buffer_size", in_buf}};
    }
  }
  latest_ = g;
  queue_.push_back(std::move(g));
  return json{{"status", "received"}};
}

ApiReply TrajectoryStore::scored_data(const json& body) {
  auto g = scored_data_normalize(body);
  std::lock_guard<std::mutex> lk(mu_);
  if (!g.ok()) {
    ++ctr_.posts_rejected;
    return bad_request("POST /scored_data: " + g.status().message() + "; nothing was enqueued");
  }
  const int64_t n = group_len(g.value());
  if (opt_.max_queued_sequences > 0 && pending_sequences_locked() + n > opt_.max_queued_sequences) {
    ++ctr_.posts_refused_full;
    return ApiReply{503,
                    json{{"status", "queue full"},
                         {"message", "the trajectory queue holds its maximum of " +
                                         std::to_string(opt_.max_queued_sequences) +
                                         " sequences; retry after the trainer has taken a batch"},
                         {"queue_size", int64_t(queue_.size())}},
                    "", opt_.retry_after_s};
  }
  return ApiReply{200, accept_locked(std::move(g).value()), "", 0};
}

ApiReply TrajectoryStore::scored_data_list(const json& body) {
  if (!body.is_array()) {
    std::lock_guard<std::mutex> lk(mu_);
    ++ctr_.posts_rejected;
    return bad_request("POST /scored_data_list: the body must be a JSON list of scored groups");
  }
  std::vector<json> groups;
  int64_t n = 0;
  for (size_t i = 0; i < body.size(); ++i) {
    auto g = scored_data_normalize(body[i]);
    if (!g.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      ++ctr_.posts_rejected;
      return bad_request("POST /scored_data_list: item " + std::to_string(i) + ": " + g.status().message() +
                         "; nothing of the list was enqueued");
    }
    n += group_len(g.value());
    groups.push_back(std::move(g).value());
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (opt_.max_queued_sequences > 0 && pending_sequences_locked() + n > opt_.max_queued_sequences) {
    ++ctr_.posts_refused_full;
    return ApiReply{503,
                    json{{"status", "queue full"},
                         {"message", "the trajectory queue cannot take " + std::to_string(n) + " more sequences (max " +
                                         std::to_string(opt_.max_queued_sequences) +
                                         "); retry after the trainer has taken a batch"},
                         {"queue_size", int64_t(queue_.size())}},
                    "", opt_.retry_after_s};
  }
  for (auto& g : groups) accept_locked(std::move(g));
  return ApiReply{200, json{{"status", "received"}, {"groups_processed", int64_t(groups.size())}}, "", 0};
}

ApiReply TrajectoryStore::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ApiReply{200, json{{"current_step", step_}, {"queue_size", int64_t(queue_.size())}}, "", 0};
}

ApiReply TrajectoryStore::status_env(const json& body) {
  auto id_r = int_field(body, "env_id", true);
  if (!id_r.ok()) return bad_request("GET /status-env: " + id_r.status().message());
  const int64_t id = id_r.value();
  std::lock_guard<std::mutex> lk(mu_);
  if (id < 0 || id >= int64_t(envs_.size()))
    return bad_request("GET /status-env: no environment with env_id " + std::to_string(id) + "; POST /register-env first");
  Env& me = envs_[size_t(id)];
  me.last_update = wall_now();
  double total = 0;
  for (const auto& e : envs_)
    if (e.connected) total += double(e.max_context_len) * std::max(0.0, e.weight);
  constexpr double kMinEnvWeight = 0.01;  // Atropos's MIN_ENV_WEIGHT: no environment is starved completely
  double env_weight = total > 0 ? double(me.max_context_len) * me.weight / total : 0.0;
  env_weight = std::max(kMinEnvWeight, env_weight);
  double total_min = 0;
  for (const auto& e : envs_)
    if (e.connected && e.min_batch_allocation) total_min += *e.min_batch_allocation;
  const double unallocated = 1.0 - std::min(total_min, 1.0);

  int64_t env_group_size = me.group_size, max_group_size = 1, self_seqs = 0;
  for (const auto& g : queue_) {
    const int64_t n = group_len(g);
    max_group_size = std::max(max_group_size, n);
    if (env_of(g) == id) {
      env_group_size = std::max(env_group_size, n);
      self_seqs += n;
    }
  }
  me.group_size = env_group_size;
  std::map<int64_t, int64_t> min_seqs;
  for (const auto& e : envs_)
    if (e.connected && e.min_batch_allocation)
      min_seqs[e.registered_id] = int64_t(double(batch_size_) * *e.min_batch_allocation);
  std::map<int64_t, int64_t> others;
  for (const auto& g : queue_)
    if (env_of(g) != id) others[env_of(g)] += group_len(g);
  int64_t available = 0;
  if (max_group_size > 1)
    for (const auto& [e, n] : others) {
      const int64_t packed = (n + max_group_size - 1) / max_group_size * max_group_size;
      available += std::max<int64_t>(0, packed - (min_seqs.count(e) ? min_seqs[e] : 0));
    }
  const int64_t env_queue = self_seqs + available;
  return ApiReply{200,
                  json{{"current_step", step_},
                       {"queue_size", env_queue / env_group_size},
                       {"unallocated_fraction", unallocated},
                       {"self_queue_size", self_seqs / env_group_size},
                       {"max_group_size", max_group_size},
                       {"env_weight", env_weight}},
                  "", 0};
}

ApiReply TrajectoryStore::latest_example() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (latest_) return ApiReply{200, *latest_, "", 0};
  json empty = json::object();
  for (const char* k : {"tokens", "masks", "scores", "advantages", "ref_logprobs", "generation_params",
                        "inference_logprobs", "messages", "images"})
    empty[k] = json::array();
  return ApiReply{200, empty, "", 0};
}

ApiReply TrajectoryStore::reset_data() {
  std::lock_guard<std::mutex> lk(mu_);
  clear_locked();
  ApiReply r;
  r.text = "Reset successful";
  return r;
}

TrajectoryCounters TrajectoryStore::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  TrajectoryCounters c = ctr_;
  c.queued_groups = int64_t(queue_.size());
  c.queued_sequences = 0;
  for (const auto& g : queue_) c.queued_sequences += group_len(g);
  for (const auto& b : curr_batch_)
    for (const auto& g : b) c.queued_sequences += group_len(g);
  c.buffered_sequences = 0;
  for (const auto& v : buffer_)
    for (const auto& g : v) c.buffered_sequences += group_len(g);
  c.envs_registered = int64_t(envs_.size());
  c.envs_connected = 0;
  for (const auto& e : envs_) c.envs_connected += e.connected;
  return c;
}

}  // namespace grpo

namespace grpo {

json TrajectoryStore::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  json envs = json::array();
  for (const Env& e : envs_)
    envs.push_back(json{{"max_context_len", e.max_context_len},
                        {"weight", e.weight},
                        {"desired_name", e.desired_name},
                        {"real_name", e.real_name},
                        {"registered_id", e.registered_id},
                        {"last_update", e.last_update},
                        {"connected", e.connected},
                        {"min_batch_allocation", e.min_batch_allocation ? json(*e.min_batch_allocation) : json()},
                        {"group_size", e.group_size}});
  json buffer = json::array();
  for (const auto& v : buffer_) buffer.push_back(json(v));
  json batches = json::array();
  for (const auto& b : curr_batch_) batches.push_back(b);
  return json{{"version", kSnapshotVersion},
              {"started", started_},
              {"envs", std::move(envs)},
              {"queue", json(queue_)},
              {"buffer", std::move(buffer)},
              {"formed_batches", std::move(batches)},
              {"latest", latest_ ? *latest_ : json()},
              {"counters",
               {{"groups_received", ctr_.groups_received},
                {"sequences_received", ctr_.sequences_received},
                {"posts_rejected", ctr_.posts_rejected},
                {"posts_refused_full", ctr_.posts_refused_full},
                {"batches_formed", ctr_.batches_formed},
                {"last_post_time", ctr_.last_post_time}}}};
}

Status TrajectoryStore::restore(const json& snap) {
  auto bad = [](const std::string& m) {
    return error_status("trajectory queue snapshot: " + m +
                        " (the checkpoint's trainer_state.json is damaged or from another version; remove its "
                        "\"trajectory_queue\" entry to resume with an empty queue)");
  };
  if (!snap.is_object()) return bad("not a JSON object");
  if (snap.value("version", json()) != json(kSnapshotVersion))
    return bad("version " + snap.value("version", json()).dump() + ", this build reads version " +
               std::to_string(kSnapshotVersion));
  for (const char* k : {"envs", "queue", "buffer", "formed_batches"})
    if (!snap.contains(k) || !snap[k].is_array()) return bad(std::string("'") + k + "' is missing or not a list");
  if (!snap.contains("counters") || !snap["counters"].is_object()) return bad("'counters' is missing or not an object");

  std::vector<Env> envs;
  for (size_t i = 0; i < snap["envs"].size(); ++i) {
    const json& j = snap["envs"][i];
    const std::string where = "envs[" + std::to_string(i) + "]";
    try {
      Env e;
      e.max_context_len = j.at("max_context_len").get<int64_t>();
      e.weight = j.at("weight").get<double>();
      e.desired_name = j.at("desired_name").get<std::string>();
      e.real_name = j.at("real_name").get<std::string>();
      e.registered_id = j.at("registered_id").get<int64_t>();
      e.last_update = j.at("last_update").get<double>();
      e.connected = j.at("connected").get<bool>();
      if (!j.at("min_batch_allocation").is_null()) e.min_batch_allocation = j.at("min_batch_allocation").get<double>();
      e.group_size = j.at("group_size").get<int64_t>();
      if (e.registered_id != int64_t(i)) return bad(where + ": registered_id " + std::to_string(e.registered_id) + " is not its position");
      if (e.group_size <= 0) return bad(where + ": group_size must be > 0");
      envs.push_back(std::move(e));
    } catch (const json::exception& ex) {
      return bad(where + ": " + ex.what());
    }
  }
  // Groups go through the checks of a post, so nothing malformed reaches a batch.
  auto check_groups = [&](const json& list, const std::string& where, std::vector<json>* out) -> Status {
    if (!list.is_array()) return bad(where + " is not a list");
    for (size_t i = 0; i < list.size(); ++i) {
      auto g = scored_data_normalize(list[i]);
      if (!g.ok()) return bad(where + "[" + std::to_string(i) + "]: " + g.status().message());
      const int64_t env = env_of(g.value());
      if (env >= int64_t(envs.size()))
        return bad(where + "[" + std::to_string(i) + "]: env_id " + std::to_string(env) + " is not a registered environment");
      out->push_back(std::move(g).value());
    }
    return ok_status();
  };
  std::vector<json> queue;
  GRPO_TRY(check_groups(snap["queue"], "queue", &queue));
  if (snap["buffer"].size() > envs.size()) return bad("'buffer' has more entries than there are environments");
  std::vector<std::vector<json>> buffer(envs.size());
  for (size_t i = 0; i < snap["buffer"].size(); ++i)
    GRPO_TRY(check_groups(snap["buffer"][i], "buffer[" + std::to_string(i) + "]", &buffer[i]));
  std::vector<json> batches;
  for (size_t i = 0; i < snap["formed_batches"].size(); ++i) {
    std::vector<json> b;
    GRPO_TRY(check_groups(snap["formed_batches"][i], "formed_batches[" + std::to_string(i) + "]", &b));
    batches.push_back(json(std::move(b)));
  }
  std::optional<json> latest;
  if (snap.contains("latest") && !snap["latest"].is_null()) latest = snap["latest"];
  TrajectoryCounters c;
  try {
    const json& j = snap["counters"];
    c.groups_received = j.at("groups_received").get<int64_t>();
    c.sequences_received = j.at("sequences_received").get<int64_t>();
    c.posts_rejected = j.at("posts_rejected").get<int64_t>();
    c.posts_refused_full = j.at("posts_refused_full").get<int64_t>();
    c.batches_formed = j.at("batches_formed").get<int64_t>();
    c.last_post_time = j.at("last_post_time").get<double>();
  } catch (const json::exception& ex) {
    return bad(std::string("counters: ") + ex.what());
  }

  std::lock_guard<std::mutex> lk(mu_);
  envs_ = std::move(envs);
  queue_ = std::move(queue);
  buffer_ = std::move(buffer);
  curr_batch_ = std::move(batches);
  latest_ = std::move(latest);
  ctr_ = c;
  ctr_.envs_registered = int64_t(envs_.size());
  // Environments registered before the checkpoint go on posting without waiting for
  // the resumed trainer's first /batch.
  started_ = started_ || (snap.contains("started") && snap["started"].is_boolean() && snap["started"].get<bool>());
  return ok_status();
}

}  // namespace grpo
