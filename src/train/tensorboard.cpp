// TensorBoard event files: crc32c, TFRecord framing, hand-encoded protobuf.
#include "train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace grpo {

namespace {

// Table for the reflected Castagnoli polynomial, built once.
struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

void put_varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void put_tag(std::string* out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }

template <class T>
void put_fixed(std::string* out, T v) {  // little endian, as protobuf and TFRecord require
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) std::reverse(b, b + sizeof(T));
  out->append(reinterpret_cast<const char*>(b), sizeof(T));
}

void put_bytes(std::string* out, uint32_t field, std::string_view s) {
  put_tag(out, field, 2);
  put_varint(out, s.size());
  out->append(s);
}

// Event fields 1 (wall_time, fixed64 double) and 2 (step, varint int64).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_tag(&e, 1, 1);
  put_fixed(&e, wall_time);
  if (step != 0) {  // proto3 omits default values
    put_tag(&e, 2, 0);
    put_varint(&e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const Crc32cTable table;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table.t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string tfrecord_frame(std::string_view data) {
  std::string rec, len;
  put_fixed(&len, static_cast<uint64_t>(data.size()));
  rec += len;
  put_fixed(&rec, crc32c_mask(crc32c(len.data(), len.size())));
  rec.append(data);
  put_fixed(&rec, crc32c_mask(crc32c(data.data(), data.size())));
  return rec;
}

std::string tb_event_file_version(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(&e, 3, "brain.Event:2");
  return e;
}

std::string tb_event_scalars(double wall_time, int64_t step, const MetricList& metrics) {
  std::string summary;
  for (const auto& [tag, v] : metrics) {
    std::string value;
    put_bytes(&value, 1, tag);
    put_tag(&value, 2, 5);
    put_fixed(&value, static_cast<float>(v));
    put_bytes(&summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(&e, 5, summary);
  return e;
}

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& logdir) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) return error_status("cannot create TensorBoard directory '" + logdir + "': " + ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  double now = unix_time_now();
  // pid and a per-process counter keep two writers opened in the same second apart.
  static std::atomic<int> counter{0};
  std::string path = logdir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host + "." +
                     std::to_string(getpid()) + "." + std::to_string(counter++);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return error_status("cannot open TensorBoard event file '" + path + "' for writing");
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(f, path));
  GRPO_TRY(w->append(tb_event_file_version(now)));
  GRPO_TRY(w->flush());
  return w;
}

namespace {

uint64_t get_le(const std::string& s, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[pos + size_t(i)]);
  return v;
}

bool get_varint(const std::string& m, size_t* p, uint64_t* v) {
  *v = 0;
  for (int shift = 0; *p < m.size() && shift < 64; shift += 7) {
    const unsigned char b = static_cast<unsigned char>(m[(*p)++]);
    *v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

struct EventRecord {
  std::string framed;   // the whole TFRecord, as stored
  int64_t step = 0;
  bool header = false;  // carries file_version
};

// Reads Event fields 2 (step) and 3 (file_version); false when the payload is not a valid message.
bool event_fields(const std::string& m, EventRecord* r) {
  size_t p = 0;
  while (p < m.size()) {
    uint64_t key, v;
    if (!get_varint(m, &p, &key)) return false;
    const uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
    if (wire == 0) {
      if (!get_varint(m, &p, &v)) return false;
      if (field == 2) r->step = static_cast<int64_t>(v);
    } else if (wire == 1 || wire == 5) {
      p += wire == 1 ? 8 : 4;
    } else if (wire == 2) {
      if (!get_varint(m, &p, &v) || v > m.size() - p) return false;
      if (field == 3) r->header = true;
      p += v;
    } else {
      return false;
    }
  }
  return p == m.size();
}

// The records of one event file up to the first damaged one (a run killed mid-write).
std::vector<EventRecord> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string f = ss.str();
  std::vector<EventRecord> out;
  size_t p = 0;
  while (p + 12 <= f.size()) {
    const uint64_t len = get_le(f, p, 8);
    if (uint32_t(get_le(f, p + 8, 4)) != crc32c_mask(crc32c(f.data() + p, 8))) break;
    if (f.size() - p < 16 || len > f.size() - p - 16) break;
    const std::string data = f.substr(p + 12, len);
    if (uint32_t(get_le(f, p + 12 + len, 4)) != crc32c_mask(crc32c(data.data(), data.size()))) break;
    EventRecord r;
    if (!event_fields(data, &r)) break;
    r.framed = f.substr(p, 16 + len);
    out.push_back(std::move(r));
    p += 16 + len;
  }
  return out;
}

// Event files of `logdir`, oldest first: by the unix time in the name, then by name.
std::vector<std::string> event_files(const std::string& logdir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  const std::string prefix = "events.out.tfevents.";
  for (const auto& de : std::filesystem::directory_iterator(logdir, ec)) {
    const std::string name = de.path().filename().string();
    if (!de.is_regular_file() || name.rfind(prefix, 0) != 0) continue;
    int64_t t = 0;
    for (size_t i = prefix.size(); i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) t = t * 10 + (name[i] - '0');
    found.emplace_back(t, de.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

}  // namespace

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open_run(const std::string& logdir,
                                                                       int64_t resume_step) {
  const std::vector<std::string> files = event_files(logdir);
  if (resume_step < 0 || files.empty()) {
    for (const auto& f : files) {
      std::error_code ec;
      if (!std::filesystem::remove(f, ec))
        return error_status("cannot remove the old TensorBoard event file '" + f + "': " + ec.message());
    }
    return open(logdir);
  }
  std::vector<EventRecord> kept;
  for (size_t i = 0; i < files.size(); ++i) {
    std::vector<EventRecord> recs = read_events(files[i]);
    int64_t first = INT64_MAX;
    for (const auto& r : recs)
      if (!r.header) first = std::min(first, r.step);
    // A later file was written by a resumed run: it replaces the steps from its first one on.
    std::erase_if(kept, [&](const EventRecord& r) { return !r.header && r.step >= first; });
    for (auto& r : recs)
      if ((r.header && i == 0) || (!r.header && r.step <= resume_step)) kept.push_back(std::move(r));
  }
  std::string content;
  for (const auto& r : kept) content += r.framed;
  if (kept.empty() || !kept.front().header) content = tfrecord_frame(tb_event_file_version(unix_time_now())) + content;
  const std::string& path = files.front();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) return error_status("cannot rewrite TensorBoard event file '" + path + "' (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return error_status("cannot replace TensorBoard event file '" + path + "': " + ec.message());
  for (size_t i = 1; i < files.size(); ++i) std::filesystem::remove(files[i], ec);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return error_status("cannot open TensorBoard event file '" + path + "' for appending");
  return std::unique_ptr<TensorBoardWriter>(new TensorBoardWriter(f, path));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

Status TensorBoardWriter::append(const std::string& event) {
  std::string rec = tfrecord_frame(event);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size())
    return error_status("error writing TensorBoard file '" + path_ + "' (disk full?)");
  return ok_status();
}

Status TensorBoardWriter::write(int64_t step, double wall_time, const MetricList& metrics) {
  if (metrics.empty()) return ok_status();
  GRPO_TRY(append(tb_event_scalars(wall_time, step, metrics)));
  return flush();
}

Status TensorBoardWriter::flush() {
  if (std::fflush(f_) != 0) return error_status("error flushing TensorBoard file '" + path_ + "'");
  return ok_status();
}

}  // namespace grpo
