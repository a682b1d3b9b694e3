// safetensors files (https://github.com/huggingface/safetensors, format:
// u64 little-endian header length N, N bytes of JSON header, then the data
// section). The reader maps the file read-only and validates the whole header
// at open (lengths, JSON, dtypes, offsets inside the data section, sizes equal
// numel × dtype size, offsets that tile the data section exactly: no gaps,
// overlaps or trailing bytes); tensors are then zero-copy host views of
// the mapping that keep it alive. The writer pads the header with spaces to a
// multiple of 8 bytes (as the Python library does) and writes atomically.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace grpo {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // any rank; Tensor views need rank <= 4
  size_t begin = 0, end = 0;   // byte offsets within the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Every problem is a Status naming the file (and tensor).
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }          // sorted by offset
  const SafetensorsEntry* find(const std::string& name) const;                       // null if absent
  // Raw bytes of a tensor inside the mapping.
  const void* data(const SafetensorsEntry& e) const;
  // Copies data-section bytes [begin, begin + n) to dst with pread on the open
  // file: no page faults on the mapping, so several threads reading disjoint
  // ranges of a file in the page cache run at memory speed.
  Status pread_into(void* dst, size_t begin, size_t n) const;
  // Host view of the tensor borrowing the mapping (zero-copy). Fails for rank > 4.
  Result<Tensor> tensor(const std::string& name) const;
  // The tensor as `dt` on the host: the zero-copy view when the dtype matches and
  // the data is aligned, else a converted copy (float types only).
  Result<Tensor> tensor_as(const std::string& name, DType dt) const;

 private:
  std::string path_;
  std::shared_ptr<void> map_;  // the mapping; unmapped when the last view is gone
  std::shared_ptr<int> fd_;    // the file the mapping came from; closed with the last copy
  size_t data_offset_ = 0;     // file offset of the data section
  const char* base_ = nullptr; // start of the data section
  size_t data_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: `src` (host or device, contiguous) stored as `dtype`
// (equal to src.dtype, or both float types: converted while writing).
struct SafetensorsWriteItem {
  std::string name;
  Tensor src;
  DType dtype;
  std::vector<int64_t> shape;  // stored shape; empty = src's shape
};

// Writes one file atomically: `path`.tmp.<pid> in the same directory, fsync, rename.
Status safetensors_write(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                         const std::map<std::string, std::string>& metadata = {});

// Writes `dir`/model.safetensors, or, when the data exceeds max_shard_bytes,
// model-0000K-of-0000N.safetensors shards and model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}). Returns the file names written.
Result<std::vector<std::string>> safetensors_write_sharded(const std::string& dir,
                                                           const std::vector<SafetensorsWriteItem>& items,
                                                           const std::map<std::string, std::string>& metadata,
                                                           size_t max_shard_bytes);

// All safetensors files of a checkpoint directory: model.safetensors.index.json
// when present (every file of its weight_map), else model.safetensors, else
// every *.safetensors in the directory.
class SafetensorsCheckpoint {
 public:
  static Result<SafetensorsCheckpoint> open(const std::string& dir);
  // The file that holds `name`, or null.
  const SafetensorsFile* file_of(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;  // every tensor name, sorted

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

// Writes `content` to `path` atomically (tmp file in the same dir, fsync, rename).
Status write_file_atomic(const std::string& path, const std::string& content);
Result<std::string> read_file(const std::string& path);

}  // namespace grpo
