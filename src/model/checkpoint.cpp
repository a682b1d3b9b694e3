// model_load / model_save: HF checkpoint directories through the arch table.
#include "model/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "core/log.h"
#include "model/arch.h"
#include "model/safetensors.h"

namespace grpo {

namespace fs = std::filesystem;

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

const char* hf_dtype_name(DType t) {
  return t == DType::bf16 ? "bfloat16" : t == DType::f16 ? "float16" : "float32";
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// n elements src -> dst with the common cases as tight loops.
void convert_range(void* dst, DType dt, const void* src, DType st, size_t n) {
  if (dt == st) {
    std::memcpy(dst, src, n * dtype_size(dt));
  } else if (st == DType::bf16 && dt == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  } else if (st == DType::f32 && dt == DType::bf16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  } else {
    convert_host(dst, dt, src, st, n);
  }
}

// Zeroes the alignment gaps between the parameter views of a host arena.
void zero_arena_gaps(ModelWeights& w) {
  char* base = static_cast<char*>(w.arena.data);
  size_t pos = 0;
  for (auto& [name, t] : w.params()) {
    size_t b = size_t(static_cast<char*>(t->data) - base);
    if (b > pos) std::memset(base + pos, 0, b - pos);
    pos = std::max(pos, b + t->nbytes());
  }
  if (w.arena.nbytes() > pos) std::memset(base + pos, 0, w.arena.nbytes() - pos);
}

}  // namespace

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",          "tokenizer_config.json", "vocab.json",
                                                 "merges.txt",              "special_tokens_map.json",
                                                 "generation_config.json",  "tokenizer.model",
                                                 "added_tokens.json",       "chat_template.jinja"};
  return names;
}

namespace {

struct TensorSource {
  const SafetensorsFile* file;
  const SafetensorsEntry* entry;
};

// Every tensor the architecture of `cfg` expects, found in `ck` with the shape it
// implies and a float dtype; the error names the first that is not.
Result<std::vector<TensorSource>> match_tensors(const ModelConfig& cfg, const SafetensorsCheckpoint& ck,
                                                const std::vector<HfTensorSpec>& specs, const std::string& dir) {
  const std::string mismatch = ": the checkpoint in " + dir + " does not match its config.json (model_type " +
                               cfg.model_type + "); check that config.json and the weights belong to the same model";
  std::vector<TensorSource> src(specs.size());
  std::set<std::string> expected;
  for (size_t i = 0; i < specs.size(); ++i) {
    const HfTensorSpec& s = specs[i];
    expected.insert(s.name);
    const SafetensorsFile* f = ck.file_of(s.name);
    if (!f) {
      std::string hint = s.name == "lm_head.weight" ? " (config.json has tie_word_embeddings=false)" : "";
      return error_status("tensor \"" + s.name + "\" with shape " + shape_string(s.shape) + " is missing" + hint + mismatch);
    }
    const SafetensorsEntry* e = f->find(s.name);
    if (e->shape != s.shape)
      return error_status("tensor \"" + s.name + "\" in " + f->path() + " has shape " + shape_string(e->shape) +
                          " but config.json implies " + shape_string(s.shape) + mismatch);
    if (!is_float(e->dtype))
      return error_status("tensor \"" + s.name + "\" in " + f->path() + " has dtype " + dtype_safetensors_name(e->dtype) +
                          "; weights must be F32, BF16 or F16 (quantized checkpoints are not supported)");
    src[i] = {f, e};
  }
  std::vector<std::string> extra;
  for (const std::string& n : ck.names())
    if (!expected.count(n) && !arch_is_harmless_extra(cfg, n)) extra.push_back(n);
  if (!extra.empty())
    GRPO_LOG_WARN("%s: %zu tensor(s) not used by a %s model were ignored (first: \"%s\")", dir.c_str(), extra.size(),
                  cfg.model_type.c_str(), extra[0].c_str());
  return src;
}

// One piece of work of fill_host: a byte range read from the file (same dtype) or
// an element range converted from the mapping.
struct FillJob {
  const SafetensorsFile* file;
  const SafetensorsEntry* entry;
  char* dst;
  size_t first, count;  // elements of the tensor
};

// Fills the views of `host` from the file(s). Same-dtype tensors are read straight
// into place with pread; the jobs are cut into chunks of about 8 MiB so that
// n_threads threads share big tensors (the embedding is a fifth of a 0.5B model).
Status fill_host(ModelWeights& host, const std::vector<HfTensorSpec>& specs, const std::vector<TensorSource>& src,
                 int n_threads, size_t chunk_bytes) {
  const DType dt = host.dtype;
  std::vector<FillJob> jobs;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor dst = arch_view(host, specs[i]);
    const SafetensorsEntry* e = src[i].entry;
    const size_t n = size_t(e->numel());
    const size_t step = std::max<size_t>(1, chunk_bytes / std::max(dtype_size(dt), dtype_size(e->dtype)));
    for (size_t b = 0; b < n; b += step)
      jobs.push_back({src[i].file, e, static_cast<char*>(dst.data) + b * dtype_size(dt), b, std::min(step, n - b)});
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error = ok_status();
  auto worker = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const FillJob& job = jobs[j];
      const size_t ss = dtype_size(job.entry->dtype);
      if (job.entry->dtype == dt) {
        Status s = job.file->pread_into(job.dst, job.entry->begin + job.first * ss, job.count * ss);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lk(mu);
          if (first_error.ok()) first_error = s;
          next = jobs.size();  // the load fails anyway: stop reading
        }
      } else {
        convert_range(job.dst, dt, static_cast<const char*>(job.file->data(*job.entry)) + job.first * ss,
                      job.entry->dtype, job.count);
      }
    }
  };
  const int n = std::max(1, std::min<int>(n_threads, int(jobs.size())));
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return first_error;
}

int default_read_threads() { return int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)); }

}  // namespace

Result<ModelWeights> model_load(const std::string& dir, Device dev, DType dt, Context* ctx) {
  (void)ctx;
  if (!is_float(dt)) return error_status(std::string("model_load: target dtype must be f32, bf16 or f16, not ") + dtype_name(dt));
  if (dev != Device::cpu && !cuda_available())
    return error_status("model_load: a CUDA device was requested but this build or machine has none");
  GRPO_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_load(dir + "/config.json"));
  GRPO_ASSIGN_OR_RETURN(SafetensorsCheckpoint ck, SafetensorsCheckpoint::open(dir));
  const std::vector<HfTensorSpec> specs = arch_tensors(cfg);
  GRPO_ASSIGN_OR_RETURN(std::vector<TensorSource> src, match_tensors(cfg, ck, specs, dir));  // before allocating
  cfg.torch_dtype = hf_dtype_name(src[0].entry->dtype);  // what the file actually holds

  ModelWeights host = weights_allocate(cfg, Device::cpu, dt);
  zero_arena_gaps(host);
  GRPO_TRY(fill_host(host, specs, src, default_read_threads(), kReadChunkBytes));
  if (dev == Device::cpu) return host;
  ModelWeights w = weights_allocate(cfg, dev, dt);
  tensor_copy(w.arena, host.arena);
  return w;
}

Result<ModelConfig> model_read_into(const std::string& dir, ModelWeights& host, int n_threads, size_t chunk_bytes) {
  if (host.device != Device::cpu || host.arena.empty())
    return error_status("model_read_into: the destination must be an allocated host arena");
  GRPO_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_load(dir + "/config.json"));
  GRPO_ASSIGN_OR_RETURN(SafetensorsCheckpoint ck, SafetensorsCheckpoint::open(dir));
  // The destination's layout decides the shapes: a file of other shapes is refused here.
  const std::vector<HfTensorSpec> specs = arch_tensors(host.config);
  GRPO_ASSIGN_OR_RETURN(std::vector<TensorSource> src, match_tensors(host.config, ck, specs, dir));
  cfg.torch_dtype = hf_dtype_name(src[0].entry->dtype);
  zero_arena_gaps(host);
  GRPO_TRY(fill_host(host, specs, src, n_threads > 0 ? n_threads : default_read_threads(), std::max<size_t>(1, chunk_bytes)));
  return cfg;
}

namespace {

bool is_model_file(const std::string& n) {
  if (n == "config.json" || n == "model.safetensors" || n == "model.safetensors.index.json") return true;
  return n.rfind("model-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
}

Status copy_tokenizer_files(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (!fs::is_directory(from, ec)) return error_status("tokenizer source " + from + " is not a directory");
  int n = 0;
  for (const auto& name : tokenizer_file_names()) {
    fs::path p = fs::path(from) / name;
    if (!fs::exists(p, ec)) continue;
    GRPO_ASSIGN_OR_RETURN(std::string content, read_file(p.string()));
    GRPO_TRY(write_file_atomic(to + "/" + name, content));
    ++n;
  }
  if (n == 0) GRPO_LOG_WARN("tokenizer source %s holds no tokenizer files; the checkpoint has none", from.c_str());
  return ok_status();
}

// Moves the finished `tmp` directory to `dir`. Regular files of an existing
// `dir` that the new checkpoint does not write are hard-linked into tmp first
// and subdirectories are moved after the swap, so nothing unrelated is lost.
Status replace_dir(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (std::rename(tmp.c_str(), dir.c_str()) != 0)
      return error_status(dir.string() + ": rename from " + tmp.string() + " failed: " + std::strerror(errno));
    return ok_status();
  }
  if (!fs::is_directory(dir, ec)) return error_status(dir.string() + " exists and is not a directory");
  std::vector<fs::path> subdirs;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    std::string n = de.path().filename().string();
    if (de.is_directory()) { subdirs.push_back(n); continue; }
    if (is_model_file(n) || n.find(".tmp.") != std::string::npos || fs::exists(tmp / n)) continue;
    fs::create_hard_link(de.path(), tmp / n, ec);
    if (ec) fs::copy_file(de.path(), tmp / n, ec);
    if (ec) return error_status(dir.string() + ": cannot carry " + n + " into the new checkpoint: " + ec.message());
  }
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    // tmp now holds the previous checkpoint
    for (const auto& s : subdirs) fs::rename(tmp / s, dir / s, ec);
    fs::remove_all(tmp, ec);
    return ok_status();
  }
  // Filesystems without RENAME_EXCHANGE: two renames (a crash between them leaves <dir>.old-<pid>).
  fs::path old = dir;
  old += ".old-" + std::to_string(getpid());
  if (std::rename(dir.c_str(), old.c_str()) != 0)
    return error_status(dir.string() + ": cannot move the previous checkpoint aside: " + std::strerror(errno));
  if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
    std::rename(old.c_str(), dir.c_str());
    return error_status(dir.string() + ": rename failed: " + std::strerror(errno));
  }
  for (const auto& s : subdirs) fs::rename(old / s, dir / s, ec);
  fs::remove_all(old, ec);
  return ok_status();
}

}  // namespace

Status model_save(const std::string& dir_in, const ModelWeights& w, const SaveOptions& opt) {
  fs::path dir = fs::absolute(fs::path(dir_in)).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  const ModelConfig& c0 = w.config;
  DType out = w.dtype;
  switch (opt.dtype) {
    case SaveDType::as_loaded:
      if (c0.torch_dtype == "bfloat16") out = DType::bf16;
      else if (c0.torch_dtype == "float16") out = DType::f16;
      else if (c0.torch_dtype == "float32") out = DType::f32;
      break;
    case SaveDType::bf16: out = DType::bf16; break;
    case SaveDType::f32: out = DType::f32; break;
    case SaveDType::f16: out = DType::f16; break;
  }
  if (!is_float(out) || !is_float(w.dtype)) return error_status("model_save: weights and output must be float types");
  ModelConfig cfg = c0;
  cfg.torch_dtype = hf_dtype_name(out);

  std::vector<SafetensorsWriteItem> items;
  for (const HfTensorSpec& s : arch_tensors(cfg)) items.push_back({s.name, arch_view(w, s), out, s.shape});

  std::error_code ec;
  fs::create_directories(dir.parent_path(), ec);
  fs::path tmp = dir;
  tmp += ".tmp-" + std::to_string(getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec))
    return error_status(tmp.string() + ": cannot create the temporary directory: " + ec.message());
  auto fail = [&](const Status& s) {
    fs::remove_all(tmp, ec);
    return s.with_context("saving " + dir.string());
  };
  Status st = write_file_atomic((tmp / "config.json").string(), model_config_to_json(cfg).dump(2) + "\n");
  if (!st.ok()) return fail(st);
  auto files = safetensors_write_sharded(tmp.string(), items, {{"format", "pt"}}, opt.max_shard_bytes);
  if (!files.ok()) return fail(files.status());
  if (!opt.tokenizer_src_dir.empty()) {
    st = copy_tokenizer_files(opt.tokenizer_src_dir, tmp.string());
    if (!st.ok()) return fail(st);
  }
  for (const auto& [name, content] : opt.extra_files) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      return fail(error_status("extra file name \"" + name + "\" must be a plain file name"));
    st = write_file_atomic((tmp / name).string(), content);
    if (!st.ok()) return fail(st);
  }
  st = replace_dir(tmp, dir);
  if (!st.ok()) return fail(st);
  int fd = ::open(dir.parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) { ::fsync(fd); ::close(fd); }
  return ok_status();
}

}  // namespace grpo
