// Adapters served by name (see lora_registry.h).
#include "server/lora_registry.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace grpo {

struct LoraRegistry::Entry {
  std::string name, path;
  int slot = -1;
  int64_t created = 0;
  std::unique_ptr<LoraWeights> w;
  int64_t n_requests = 0;  // guarded by the registry's mu_
  int n_in_flight = 0;     // guarded by the registry's mu_
};

Result<LoraModule> lora_module_parse(const std::string& arg) {
  auto bad = [&](const std::string& m) {
    return error_status("--lora-modules '" + arg + "': " + m +
                        " (give NAME=PATH, or {\"name\": NAME, \"path\": PATH} as vLLM does)");
  };
  LoraModule m;
  if (!arg.empty() && arg.front() == '{') {
    const nlohmann::json j = nlohmann::json::parse(arg, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("invalid JSON");
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "name" && it.key() != "path" && it.key() != "base_model_name")
        return bad("unknown key '" + it.key() + "'");
    for (const char* k : {"name", "path"})
      if (!j.contains(k) || !j[k].is_string()) return bad(std::string("'") + k + "' (a string) is missing");
    m.name = j["name"].get<std::string>();
    m.path = j["path"].get<std::string>();
    if (j.contains("base_model_name")) {
      if (!j["base_model_name"].is_string()) return bad("'base_model_name' must be a string");
      m.base_model_name = j["base_model_name"].get<std::string>();
    }
  } else {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) return bad("no '='");
    m.name = arg.substr(0, eq);
    m.path = arg.substr(eq + 1);
  }
  if (m.name.empty()) return bad("the name is empty");
  if (m.path.empty()) return bad("the path is empty");
  return m;
}

LoraRegistry::Lease::Lease(LoraRegistry* reg, std::shared_ptr<Entry> e) : reg_(reg), e_(std::move(e)) {}
LoraRegistry::Lease::Lease(Lease&& o) noexcept : reg_(o.reg_), e_(std::move(o.e_)) { o.reg_ = nullptr; }
LoraRegistry::Lease& LoraRegistry::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (reg_ && e_) reg_->release(*e_);
    reg_ = o.reg_;
    e_ = std::move(o.e_);
    o.reg_ = nullptr;
  }
  return *this;
}
LoraRegistry::Lease::~Lease() {
  if (reg_ && e_) reg_->release(*e_);
}
int LoraRegistry::Lease::slot() const { return e_ ? e_->slot : -1; }

LoraRegistry::LoraRegistry(const ModelConfig& mc, Device dev, DType dt, LoraRegistryOptions opt)
    : mc_(mc), dev_(dev), dt_(dt), opt_(std::move(opt)), max_rank_(opt_.max_lora_rank),
      slot_taken_(size_t(std::max(0, opt_.max_loras)), false) {}

LoraRegistry::~LoraRegistry() = default;

void LoraRegistry::release(Entry& e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    --e.n_in_flight;
  }
  released_.notify_all();
}

Result<std::unique_ptr<LoraWeights>> LoraRegistry::read_adapter(const std::string& name, const std::string& path,
                                                                LoraOpError* why) const {
  *why = LoraOpError::bad_request;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    *why = LoraOpError::not_found;
    return error_status("No adapter found for " + path + " (LoRA adapter '" + name +
                        "': not a directory; give a PEFT adapter directory with adapter_config.json and "
                        "adapter_model.safetensors)");
  }
  auto l = lora_load(path, mc_, dev_, dt_);
  if (!l.ok())
    return error_status("LoRA adapter '" + name + "' (" + path + ") does not fit the served model: " +
                        l.status().message());
  if (max_rank_ > 0 && l.value().cfg.r > max_rank_)
    return error_status("LoRA adapter '" + name + "' (" + path + ") has rank r=" + std::to_string(l.value().cfg.r) +
                        ", above this server's --max-lora-rank " + std::to_string(max_rank_) +
                        "; restart with a larger --max-lora-rank");
  *why = LoraOpError::none;
  return std::make_unique<LoraWeights>(std::move(l).value());
}

Status LoraRegistry::load_initial(const std::vector<LoraModule>& mods) {
  if (int(mods.size()) > opt_.max_loras)
    return error_status("--lora-modules lists " + std::to_string(mods.size()) + " adapters but --max-loras is " +
                        std::to_string(opt_.max_loras) +
                        ": every adapter is resident in an engine slot here; raise --max-loras");
  for (const LoraModule& m : mods) {
    if (m.name == opt_.base_name)
      return error_status("--lora-modules " + m.name + "=" + m.path +
                          ": the name is the base model's served name; choose another");
    if (!m.base_model_name.empty() && m.base_model_name != opt_.base_name)
      return error_status("--lora-modules " + m.name + ": base_model_name '" + m.base_model_name +
                          "' is not the served model '" + opt_.base_name + "'");
    for (const auto& e : entries_)
      if (e->name == m.name) return error_status("--lora-modules: the name '" + m.name + "' is given twice");
    LoraOpError why;
    auto w = read_adapter(m.name, m.path, &why);
    if (!w.ok()) return w.status().with_context("--lora-modules");
    auto e = std::make_shared<Entry>();
    e->name = m.name;
    e->path = m.path;
    e->slot = int(entries_.size());
    e->created = int64_t(std::time(nullptr));
    e->w = std::move(w).value();
    slot_taken_[size_t(e->slot)] = true;
    entries_.push_back(std::move(e));
  }
  if (max_rank_ <= 0) {  // vLLM's default of 16, or more when a start-up adapter needs it
    max_rank_ = 16;
    for (const auto& e : entries_) max_rank_ = std::max(max_rank_, e->w->cfg.r);
  }
  return ok_status();
}

std::vector<const LoraWeights*> LoraRegistry::engine_slots() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<const LoraWeights*> s(slot_taken_.size(), nullptr);
  for (const auto& e : entries_) s[size_t(e->slot)] = e->w.get();
  return s;
}

std::optional<LoraRegistry::Lease> LoraRegistry::acquire(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& e : entries_)
    if (e->name == name) {
      ++e->n_in_flight;
      ++e->n_requests;
      return Lease(this, e);
    }
  return std::nullopt;
}

std::vector<LoraRegistry::Info> LoraRegistry::list() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Info> out;
  for (const auto& e : entries_) out.push_back(Info{e->name, e->path, e->slot, e->created, e->n_requests, e->n_in_flight});
  return out;
}

Status LoraRegistry::load(const std::string& name, const std::string& path, bool inplace, LoraOpError* why) {
  *why = LoraOpError::bad_request;
  if (!svc_) return error_status("runtime LoRA loading is off (start grpo serve with --enable-lora-updates)");
  int slot = -1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (name == opt_.base_name)
      return error_status("'" + name + "' is the base model's served name; choose another lora_name");
    if (std::find(reserved_names_.begin(), reserved_names_.end(), name) != reserved_names_.end())
      return error_status("a load of the lora adapter '" + name + "' is in progress; retry when it has finished");
    bool taken = false;
    for (const auto& e : entries_) taken = taken || e->name == name;
    if (taken && !inplace) return error_status("The lora adapter '" + name + "' has already been loaded.");
    for (size_t k = 0; k < slot_taken_.size() && slot < 0; ++k)
      if (!slot_taken_[k]) slot = int(k);
    if (slot < 0)
      return error_status("no free LoRA slot: all " + std::to_string(slot_taken_.size()) + " (--max-loras) hold adapters; " +
                          (taken ? "load_inplace stages the new weights in a free slot while requests finish on the "
                                   "old ones: raise --max-loras by one"
                                 : "unload one first (POST /v1/unload_lora_adapter)"));
    slot_taken_[size_t(slot)] = true;
    reserved_names_.push_back(name);
  }
  auto unreserve = [&] { reserved_names_.erase(std::find(reserved_names_.begin(), reserved_names_.end(), name)); };
  auto undo = [&] {
    std::lock_guard<std::mutex> lk(mu_);
    slot_taken_[size_t(slot)] = false;
    unreserve();
  };
  // Read beside serving: only the slot assignment waits for a gap between steps.
  svc_->engine().context().make_current();  // this thread allocates on the engine's device
  auto w = read_adapter(name, path, why);
  if (!w.ok()) {
    undo();
    return w.status();
  }
  const LoraWeights* wp = w.value().get();
  Status st = svc_->run_on_loop([slot, wp](Engine& eng) { return eng.set_lora_slot(slot, wp); });
  if (!st.ok()) {
    undo();
    *why = LoraOpError::bad_request;
    return st;
  }
  auto e = std::make_shared<Entry>();
  e->name = name;
  e->path = path;
  e->slot = slot;
  e->created = int64_t(std::time(nullptr));
  e->w = std::move(w).value();
  std::shared_ptr<Entry> old;  // load_inplace: the adapter the name served until now
  {
    std::lock_guard<std::mutex> lk(mu_);
    unreserve();
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& x) { return x->name == name; });
    if (it != entries_.end()) {
      old = *it;
      e->n_requests = old->n_requests;
      *it = e;  // new requests get the new adapter from here on
    } else {
      entries_.push_back(e);
    }
  }
  *why = LoraOpError::none;
  GRPO_LOG_INFO("serve: loaded LoRA adapter '%s' from %s into slot %d%s", name.c_str(), path.c_str(), slot,
                old ? " (replacing its previous weights)" : "");
  if (old) {
    // Requests already on the old weights finish on them; then their slot is freed.
    Status rs = retire(old);
    if (!rs.ok()) GRPO_LOG_WARN("serve: %s", rs.message().c_str());
  }
  return ok_status();
}

Status LoraRegistry::retire(const std::shared_ptr<Entry>& e) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    // Requests that hold it finish on it; their answers release the lease.
    released_.wait(lk, [&] { return e->n_in_flight == 0; });
  }
  const int slot = e->slot;
  Status st = svc_->run_on_loop([slot](Engine& eng) { return eng.set_lora_slot(slot, nullptr); });
  if (!st.ok()) return st.with_context("freeing the slot of LoRA adapter '" + e->name + "'");
  {
    std::lock_guard<std::mutex> lk(mu_);
    slot_taken_[size_t(slot)] = false;
  }
  svc_->engine().context().make_current();  // e's buffers may be freed on this thread
  return ok_status();
}

Status LoraRegistry::unload(const std::string& name, LoraOpError* why) {
  *why = LoraOpError::bad_request;
  if (!svc_) return error_status("runtime LoRA unloading is off (start grpo serve with --enable-lora-updates)");
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& x) { return x->name == name; });
    if (it == entries_.end()) {
      *why = LoraOpError::not_found;
      return error_status("The lora adapter '" + name + "' cannot be found.");
    }
    e = *it;
    entries_.erase(it);  // new requests no longer find it
  }
  Status st = retire(e);
  if (!st.ok()) {  // a request that bypassed the leases still runs on it: keep serving the adapter
    std::lock_guard<std::mutex> lk(mu_);
    entries_.push_back(e);
    return st;
  }
  *why = LoraOpError::none;
  GRPO_LOG_INFO("serve: unloaded LoRA adapter '%s' (slot %d)", name.c_str(), e->slot);
  return ok_status();  // e (and its buffers) go with the last reference
}

}  // namespace grpo
