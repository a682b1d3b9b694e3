// TensorBoard event files: crc32c, TFRecord framing, hand-encoded protobuf.
#include "train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <filesystem>

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
