// safetensors reader (mmap + header validation) and atomic writers.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace grpo {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;  // the Python library refuses headers over 100 MB too

std::string sys_err() { return std::strerror(errno); }

Status parse_entry(const std::string& name, const json& v, size_t data_size, SafetensorsEntry* e) {
  auto bad = [&](const std::string& what) { return error_status("tensor \"" + name + "\": " + what); };
  if (!v.is_object()) return bad("header entry is not an object");
  auto dt = v.find("dtype"), sh = v.find("shape"), off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return bad("missing \"dtype\"");
  if (sh == v.end() || !sh->is_array()) return bad("missing \"shape\"");
  if (off == v.end() || !off->is_array() || off->size() != 2) return bad("\"data_offsets\" must be [begin, end]");
  std::string dts = dt->get<std::string>();
  if (!dtype_from_safetensors(dts, &e->dtype))
    return bad("dtype \"" + dts + "\" is not supported (supported: F32, BF16, F16, I32, I64, U8)");
  e->name = name;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
      return bad("shape " + sh->dump() + " must hold non-negative integers");
    e->shape.push_back(d.get<int64_t>());
  }
  for (const auto& o : *off)
    if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
      return bad("data_offsets " + off->dump() + " must hold non-negative integers");
  uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
  if (b > en) return bad("data_offsets " + off->dump() + " has begin > end");
  if (en > data_size)
    return bad("data_offsets " + off->dump() + " reach past the end of the data section (" + std::to_string(data_size) +
               " bytes): the file is truncated or corrupt; re-download or re-save it");
  unsigned __int128 want = dtype_size(e->dtype);
  for (int64_t s : e->shape) want *= uint64_t(s);
  if (want != en - b)
    return bad("holds " + std::to_string(en - b) + " bytes but shape " + sh->dump() + " of " + dts + " needs " +
               std::to_string(uint64_t(want)));
  e->begin = b;
  e->end = en;
  return ok_status();
}
}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto fail = [&](const std::string& m) { return error_status(path + ": " + m); };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("cannot open: " + sys_err());
  struct stat st;
  if (fstat(fd, &st) != 0) { ::close(fd); return fail("cannot stat: " + sys_err()); }
  size_t size = size_t(st.st_size);
  if (size < 8) { ::close(fd); return fail("file is " + std::to_string(size) + " bytes, too short for a safetensors header (truncated?)"); }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) { ::close(fd); return fail("mmap failed: " + sys_err()); }
  SafetensorsFile f;
  f.path_ = path;
  // Kept open so that pread_into reads the very file the header came from, even
  // when the path is replaced meanwhile.
  f.fd_ = std::shared_ptr<int>(new int(fd), [](int* q) { ::close(*q); delete q; });
  f.map_ = std::shared_ptr<void>(m, [size](void* p) { munmap(p, size); });
  const unsigned char* p = static_cast<const unsigned char*>(m);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];  // little-endian u64
  if (n > size - 8)
    return fail("header length " + std::to_string(n) + " is beyond the file size " + std::to_string(size) +
                " (truncated or not a safetensors file)");
  if (n > kMaxHeader) return fail("header length " + std::to_string(n) + " is over the 100 MB limit");
  json h = json::parse(reinterpret_cast<const char*>(p + 8), reinterpret_cast<const char*>(p + 8 + n), nullptr, false);
  if (h.is_discarded() || !h.is_object()) return fail("malformed header JSON (corrupt file); re-download or re-save it");
  f.base_ = reinterpret_cast<const char*>(p) + 8 + n;
  f.data_offset_ = size_t(8 + n);
  f.data_size_ = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) return fail("__metadata__ must be an object of strings");
      for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
        if (!m2->is_string()) return fail("__metadata__ value \"" + m2.key() + "\" is not a string");
        f.metadata_[m2.key()] = m2->get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    Status s = parse_entry(it.key(), *it, f.data_size_, &e);
    if (!s.ok()) return s.with_context(path);
    f.entries_.push_back(std::move(e));
  }
  std::sort(f.entries_.begin(), f.entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors must tile the data section exactly, as the Rust reference
  // requires: a header length lowered into its space padding still parses but
  // shifts every tensor, which only shows up as bytes left over at the end.
  size_t expect = 0;
  const SafetensorsEntry* prev = nullptr;
  for (size_t i = 0; i < f.entries_.size(); ++i) {
    const SafetensorsEntry& e = f.entries_[i];
    if (e.begin < expect)
      return fail("tensors \"" + prev->name + "\" (bytes " + std::to_string(prev->begin) + ".." +
                  std::to_string(prev->end) + ") and \"" + e.name + "\" (bytes " + std::to_string(e.begin) + ".." +
                  std::to_string(e.end) + ") overlap in the data section (corrupt file); re-download or re-save it");
    if (e.begin > expect)
      return fail("tensor \"" + e.name + "\" begins at byte " + std::to_string(e.begin) + " of the data section but " +
                  (prev ? "the previous tensor \"" + prev->name + "\" ends at byte " + std::to_string(expect)
                        : std::string("the data section starts at byte 0")) +
                  ": " + std::to_string(e.begin - expect) +
                  " bytes belong to no tensor (corrupt header offsets); re-download or re-save it");
    expect = e.end;
    prev = &e;
    f.index_[e.name] = i;
  }
  if (expect != f.data_size_)
    return fail(std::to_string(f.data_size_ - expect) + " bytes of the " + std::to_string(f.data_size_) +
                "-byte data section follow " +
                (prev ? "the last tensor \"" + prev->name + "\" (ends at byte " + std::to_string(expect) + ")"
                      : std::string("a header without tensors")) +
                " and belong to no tensor: the header length (" + std::to_string(n) +
                ") is wrong or bytes were appended (corrupt file); re-download or re-save it");
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const void* SafetensorsFile::data(const SafetensorsEntry& e) const { return base_ + e.begin; }

Status SafetensorsFile::pread_into(void* dst, size_t begin, size_t n) const {
  if (begin > data_size_ || n > data_size_ - begin)
    return error_status(path_ + ": read of bytes [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                        ") is outside the data section of " + std::to_string(data_size_) + " bytes");
  char* d = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(*fd_, d + done, n - done, off_t(data_offset_ + begin + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return error_status(path_ + ": read failed: " + sys_err());
    if (r == 0)
      return error_status(path_ + ": the file ended early (truncated while being read?); save the checkpoint again");
    done += size_t(r);
  }
  return ok_status();
}

Result<Tensor> SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return error_status(path_ + ": no tensor \"" + name + "\"");
  if (e->shape.size() > size_t(kMaxDims))
    return error_status(path_ + ": tensor \"" + name + "\" has rank " + std::to_string(e->shape.size()) + " (max 4)");
  Tensor t = tensor_borrow(const_cast<char*>(base_ + e->begin), e->dtype, Device::cpu, e->shape);
  if (e->begin == e->end) t.data = const_cast<char*>(base_);  // keep empty tensors "defined"
  t.owner = map_;
  return t;
}

Result<Tensor> SafetensorsFile::tensor_as(const std::string& name, DType dt) const {
  GRPO_ASSIGN_OR_RETURN(Tensor t, tensor(name));
  bool aligned = reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0;
  if (t.dtype == dt && aligned) return t;
  auto is_float = [](DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; };
  if (t.dtype != dt && !(is_float(t.dtype) && is_float(dt)))
    return error_status(path_ + ": tensor \"" + name + "\" is " + dtype_name(t.dtype) + " and cannot be converted to " +
                        dtype_name(dt));
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  Tensor out = tensor_empty(Device::cpu, dt, shape);
  if (t.dtype == dt) std::memcpy(out.data, t.data, t.nbytes());
  else {
    // unaligned sources are first copied to aligned memory
    Tensor src = t;
    if (!aligned) {
      src = tensor_empty(Device::cpu, t.dtype, shape);
      std::memcpy(src.data, t.data, t.nbytes());
    }
    convert_host(out.data, dt, src.data, src.dtype, size_t(t.numel()));
  }
  return out;
}

// ---------------------------------------------------------------- writing

namespace {
// Write-all with errno reporting.
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t k = ::write(fd, c, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += k;
    n -= size_t(k);
  }
  return true;
}

std::string tmp_name(const std::string& path) { return path + ".tmp." + std::to_string(getpid()); }

Status fsync_dir(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ok_status();  // best effort
  ::fsync(fd);
  ::close(fd);
  return ok_status();
}

// Opens `path`.tmp, calls body(fd), fsyncs and renames it into place.
template <class F>
Status write_atomic(const std::string& path, F&& body) {
  std::string tmp = tmp_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return error_status(tmp + ": cannot create: " + sys_err());
  Status s = body(fd);
  if (s.ok() && ::fsync(fd) != 0) s = error_status(tmp + ": fsync failed: " + sys_err());
  if (::close(fd) != 0 && s.ok()) s = error_status(tmp + ": close failed: " + sys_err());
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) s = error_status(path + ": rename failed: " + sys_err());
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return fsync_dir(path);
}

size_t item_bytes(const SafetensorsWriteItem& it) { return size_t(it.src.numel()) * dtype_size(it.dtype); }
}  // namespace

Status write_file_atomic(const std::string& path, const std::string& content) {
  return write_atomic(path, [&](int fd) -> Status {
    if (!write_all(fd, content.data(), content.size())) return error_status(path + ": write failed: " + sys_err());
    return ok_status();
  });
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error_status(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Status safetensors_write(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                         const std::map<std::string, std::string>& metadata) {
  // Data order: larger element size first (keeps every tensor aligned to its
  // element size, as the Python writer does), then the caller's order.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return dtype_size(items[a].dtype) > dtype_size(items[b].dtype); });
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> seen;
  size_t off = 0;
  for (size_t i : order) {
    const SafetensorsWriteItem& it = items[i];
    if (!seen.insert(it.name).second) return error_status(path + ": tensor name \"" + it.name + "\" given twice");
    std::vector<int64_t> shape = it.shape.empty() ? std::vector<int64_t>(it.src.shape, it.src.shape + it.src.ndim) : it.shape;
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    GRPO_CHECK_MSG(n == it.src.numel(), "safetensors_write: shape does not match the source tensor");
    size_t bytes = item_bytes(it);
    h[it.name] = {{"dtype", dtype_safetensors_name(it.dtype)}, {"shape", shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  return write_atomic(path, [&](int fd) -> Status {
    unsigned char len[8];
    uint64_t n = hs.size();
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
    if (!write_all(fd, len, 8) || !write_all(fd, hs.data(), hs.size()))
      return error_status(path + ": write failed: " + sys_err());
    std::vector<char> buf;
    for (size_t i : order) {
      const SafetensorsWriteItem& it = items[i];
      // Chunked so that converting or staging from the device needs little memory.
      const int64_t n_el = it.src.numel();
      const int64_t chunk = std::max<int64_t>(1, (int64_t(16) << 20) / int64_t(dtype_size(it.src.dtype)));
      Tensor flat = it.src.view({n_el});
      for (int64_t b = 0; b < n_el; b += chunk) {
        int64_t e = std::min(n_el, b + chunk);
        Tensor part = flat.slice0(b, e);
        const void* src = part.data;
        Tensor host;
        if (!part.on_cpu()) {
          host = tensor_empty(Device::cpu, part.dtype, {e - b});
          tensor_copy(host, part);
          src = host.data;
        }
        const void* out = src;
        if (it.dtype != part.dtype) {
          buf.resize(size_t(e - b) * dtype_size(it.dtype));
          convert_host(buf.data(), it.dtype, src, part.dtype, size_t(e - b));
          out = buf.data();
        }
        if (!write_all(fd, out, size_t(e - b) * dtype_size(it.dtype)))
          return error_status(path + ": write failed (disk full?): " + sys_err());
      }
    }
    return ok_status();
  });
}

Result<std::vector<std::string>> safetensors_write_sharded(const std::string& dir,
                                                           const std::vector<SafetensorsWriteItem>& items,
                                                           const std::map<std::string, std::string>& metadata,
                                                           size_t max_shard_bytes) {
  size_t total = 0;
  for (const auto& it : items) total += item_bytes(it);
  if (max_shard_bytes == 0 || total <= max_shard_bytes) {
    GRPO_TRY(safetensors_write(dir + "/model.safetensors", items, metadata));
    return std::vector<std::string>{"model.safetensors"};
  }
  // Greedy split in the given order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<SafetensorsWriteItem>> shards(1);
  size_t cur = 0;
  for (const auto& it : items) {
    size_t b = item_bytes(it);
    if (cur > 0 && cur + b > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(it);
    cur += b;
  }
  std::vector<std::string> names;
  json weight_map = json::object();
  char buf[64];
  for (size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    names.push_back(buf);
    GRPO_TRY(safetensors_write(dir + "/" + buf, shards[s], metadata));
    for (const auto& it : shards[s]) weight_map[it.name] = buf;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  GRPO_TRY(write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  names.push_back("model.safetensors.index.json");
  return names;
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::string& dir) {
  SafetensorsCheckpoint ck;
  std::vector<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path)) {
    GRPO_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return error_status(index_path + ": malformed index (needs a \"weight_map\" object); re-download or re-save it");
    std::set<std::string> uniq;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) return error_status(index_path + ": weight_map entry \"" + it.key() + "\" is not a file name");
      std::string fn = it->get<std::string>();
      if (fn.find('/') != std::string::npos)
        return error_status(index_path + ": weight_map file \"" + fn + "\" must be a plain file name");
      if (uniq.insert(fn).second) files.push_back(fn);
    }
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    std::error_code ec;
    for (const auto& de : fs::directory_iterator(dir, ec))
      if (de.path().extension() == ".safetensors") files.push_back(de.path().filename().string());
    std::sort(files.begin(), files.end());
    if (ec || files.empty())
      return error_status(dir + ": no model.safetensors, model.safetensors.index.json or *.safetensors found "
                          "(is this a Hugging Face model directory?)");
  }
  for (const auto& fn : files) {
    GRPO_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir + "/" + fn));
    size_t idx = ck.files_.size();
    for (const auto& e : f.entries()) {
      auto [it, fresh] = ck.where_.emplace(e.name, idx);
      if (!fresh)
        return error_status(dir + ": tensor \"" + e.name + "\" appears in both " + ck.files_[it->second].path() +
                            " and " + f.path());
    }
    ck.files_.push_back(std::move(f));
  }
  return ck;
}

const SafetensorsFile* SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second];
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

}  // namespace grpo
