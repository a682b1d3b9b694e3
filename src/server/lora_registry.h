// The LoRA adapters `grpo serve` serves by name (vLLM's --lora-modules, the `model`
// field, /v1/load_lora_adapter and /v1/unload_lora_adapter; docs/serve.md).
//
// Each adapter sits in one of the engine's LoRA slots (EngineOptions::lora_slots, a
// fixed number: --max-loras); a request names it in `model` and runs with that slot.
// A request holds a Lease on its adapter from parsing until its answer is complete, so
// an unload waits for the requests already using the adapter and only then frees the
// slot; new requests stop finding the name at once. Slots change between engine steps
// (EngineService::run_on_loop), never under a running request, and every adapter put
// into a slot starts a fresh prefix-cache namespace (Engine::set_lora_slot).
//
// Thread-safe: HTTP workers acquire leases and list adapters while others load or unload.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine_service.h"
#include "model/lora.h"

namespace grpo {

// One --lora-modules value: NAME=PATH, or vLLM's JSON form {"name": ..., "path": ...}
// (an optional "base_model_name" must then be the served model's name).
struct LoraModule {
  std::string name, path, base_model_name;
};
Result<LoraModule> lora_module_parse(const std::string& arg);

struct LoraRegistryOptions {
  int max_loras = 1;      // engine slots
  int max_lora_rank = 0;  // largest r an adapter may have; 0: max(16, the start-up adapters' largest)
  std::string base_name;  // the served base model's name (an adapter may not take it)
};

// What went wrong in a load or unload, for the HTTP status: bad_request 400, not_found 404.
enum class LoraOpError { none, bad_request, not_found };

class LoraRegistry {
 public:
  // Adapters are loaded for base `mc` in `dt` on `dev` (the served weights').
  LoraRegistry(const ModelConfig& mc, Device dev, DType dt, LoraRegistryOptions opt);
  ~LoraRegistry();

  // Before the engine exists: loads the start-up adapters into slots 0, 1, ... Errors name
  // the module and its directory (a mismatch with the base, a rank above max_lora_rank, a
  // duplicate name, more modules than slots).
  Status load_initial(const std::vector<LoraModule>& mods);
  // The engine's EngineOptions::lora_slots (max_loras entries; null = free).
  std::vector<const LoraWeights*> engine_slots() const;
  // The service (and its engine, created with engine_slots()) that runtime loads change.
  void attach(EngineService* svc) { svc_ = svc; }

  struct Entry;
  // A request's hold on an adapter (see above). Movable; releases on destruction.
  class Lease {
   public:
    Lease() = default;
    Lease(LoraRegistry* reg, std::shared_ptr<Entry> e);
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    ~Lease();
    int slot() const;

   private:
    LoraRegistry* reg_ = nullptr;
    std::shared_ptr<Entry> e_;
  };
  // The adapter called `name`, held for one request; nullopt when there is none.
  std::optional<Lease> acquire(const std::string& name);

  struct Info {
    std::string name, path;
    int slot = -1;
    int64_t created = 0;         // unix seconds of the load
    int64_t n_requests = 0;      // generation requests that named it
    int n_in_flight = 0;         // of them, not yet answered
  };
  std::vector<Info> list() const;  // in load order
  int n_slots() const { return opt_.max_loras; }
  int max_lora_rank() const { return max_rank_; }  // EngineOptions::max_lora_rank

  // Runtime updates (need attach()). load: reads the adapter beside serving, then puts it
  // into a free slot between two engine steps. inplace (vLLM's load_inplace): a name already
  // served may be loaded again; the new weights take a free slot, new requests get them at
  // once, and the old weights' slot is freed when the requests on them have been answered
  // (the call returns then). unload: the name disappears at once; waits until the requests
  // holding it have been answered, then frees its slot. On error *why says which HTTP
  // status fits and nothing changed.
  Status load(const std::string& name, const std::string& path, bool inplace, LoraOpError* why);
  Status unload(const std::string& name, LoraOpError* why);

 private:
  Result<std::unique_ptr<LoraWeights>> read_adapter(const std::string& name, const std::string& path,
                                                    LoraOpError* why) const;
  void release(Entry& e);
  // Waits until no request holds e (no longer reachable by name), then empties its slot.
  Status retire(const std::shared_ptr<Entry>& e);

  const ModelConfig mc_;
  const Device dev_;
  const DType dt_;
  const LoraRegistryOptions opt_;
  int max_rank_ = 0;  // opt_.max_lora_rank, or resolved by load_initial
  EngineService* svc_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable released_;
  std::vector<std::shared_ptr<Entry>> entries_;  // the names requests can use, in load order
  std::vector<bool> slot_taken_;                 // held by an entry, or reserved by a load in progress
  std::vector<std::string> reserved_names_;      // loads in progress
};

}  // namespace grpo
