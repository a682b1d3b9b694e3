// Hugging Face model directories (config.json + *.safetensors [+ tokenizer
// files]) <-> ModelWeights. Loading checks every expected tensor (name, shape)
// against the architecture table before touching the arena; saving writes the
// HF names (splitting wqkv / w_gate_up back) into a temporary directory that
// then replaces the target in one step, so a crash never leaves a half-written
// checkpoint where a good one was.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"
#include "model/weights.h"

namespace grpo {

// Reads dir/config.json and the safetensors file(s) into a fresh arena of
// `dt` on `dev`. f32/bf16/f16 files convert to `dt` on the host; CUDA arenas
// are filled on the host and copied up with tensor_copy. Tensors whose file
// dtype is `dt` are read with parallel preads straight into place (see
// model_read_into). `ctx` is accepted for callers that pass one; the reading
// runs on its own threads. The returned config's torch_dtype is the dtype the
// file actually held.
Result<ModelWeights> model_load(const std::string& dir, Device dev, DType dt, Context* ctx = nullptr);

// Reads the weights of `dir` into `host`, an allocated host arena (e.g. a pinned
// staging copy reused across reloads) whose config decides the expected tensor
// names and shapes: a file that differs is refused naming the tensor. Same-dtype
// tensors are copied by n_threads threads (<= 0: up to 8, by core count) with
// pread in chunks of chunk_bytes (big enough that each pread costs far more than
// handing it out; small enough that the embedding, a fifth of a 0.5B model, is
// split among all threads); other float dtypes convert. Returns dir's config.json
// with torch_dtype set to the dtype the file holds; the caller compares it with
// the running model (shapes are checked here, the remaining fields are not).
inline constexpr size_t kReadChunkBytes = size_t(8) << 20;
Result<ModelConfig> model_read_into(const std::string& dir, ModelWeights& host, int n_threads = 0,
                                    size_t chunk_bytes = kReadChunkBytes);

enum class SaveDType { as_loaded, bf16, f32, f16 };

struct SaveOptions {
  SaveDType dtype = SaveDType::as_loaded;  // as_loaded: the config's torch_dtype (else the arena dtype)
  size_t max_shard_bytes = 5ull << 30;     // larger models are sharded with an index (HF default 5 GB)
  std::string tokenizer_src_dir;           // copy the tokenizer files found there ("" = none)
  // Extra files written into the checkpoint (name, content), e.g. a converted tokenizer.json.
  std::vector<std::pair<std::string, std::string>> extra_files;
};

// Writes config.json + model.safetensors (or shards + index) into `dir`.
// Files already in `dir` that this save does not write (tokenizer files,
// trainer state) are kept; stale model*.safetensors / index files are not.
Status model_save(const std::string& dir, const ModelWeights& w, const SaveOptions& opt = {});

// The tokenizer file names copied by model_save.
const std::vector<std::string>& tokenizer_file_names();

}  // namespace grpo
