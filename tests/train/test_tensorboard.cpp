// TensorBoard event files checked structurally by an independent decoder
// written here: bitwise CRC-32C (no table), TFRecord unframing, protobuf
// wire-format walking. Field numbers come from tensorflow/core/util/event.proto
// and summary.proto (Event.wall_time=1, step=2, file_version=3, summary=5;
// Summary.value=1; Value.tag=1, simple_value=2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "train/tensorboard.h"

namespace grpo {
namespace {

uint32_t ref_crc32c(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t ref_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

uint64_t le(const std::string& s, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[pos + i]);
  return v;
}

// Splits a TFRecord stream into payloads, checking both CRCs of every record.
std::vector<std::string> unframe(const std::string& f) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < f.size()) {
    EXPECT_LE(p + 12, f.size());
    uint64_t len = le(f, p, 8);
    EXPECT_EQ(le(f, p + 8, 4), ref_mask(ref_crc32c(f.substr(p, 8)))) << "length crc at " << p;
    std::string data = f.substr(p + 12, len);
    EXPECT_EQ(le(f, p + 12 + len, 4), ref_mask(ref_crc32c(data))) << "data crc at " << p;
    out.push_back(data);
    p += 12 + len + 4;
  }
  EXPECT_EQ(p, f.size());
  return out;
}

struct Field {
  uint32_t number, wire;
  uint64_t varint = 0;  // wire 0; also raw bits of wire 1 / 5
  std::string bytes;    // wire 2
};

std::vector<Field> fields(const std::string& m) {
  std::vector<Field> out;
  size_t p = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0; p < m.size(); shift += 7) {
      unsigned char b = m[p++];
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (p < m.size()) {
    uint64_t key = varint();
    Field f{uint32_t(key >> 3), uint32_t(key & 7)};
    if (f.wire == 0) f.varint = varint();
    else if (f.wire == 1) f.varint = le(m, p, 8), p += 8;
    else if (f.wire == 5) f.varint = le(m, p, 4), p += 4;
    else if (f.wire == 2) {
      uint64_t n = varint();
      f.bytes = m.substr(p, n);
      p += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << f.wire;
      break;
    }
    out.push_back(f);
  }
  return out;
}

double as_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
float as_float(uint64_t bits) {
  uint32_t b = uint32_t(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 appendix B.4 and the usual check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xFF'), inc(32, 0), dec(32, 0);
  for (int i = 0; i < 32; ++i) inc[i] = char(i), dec[i] = char(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Incremental use equals one pass.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32c(text.data(), text.size()), ref_crc32c(text));
}

TEST(TensorBoard, FileParsesBack) {
  std::string dir = testing::TempDir() + "tb_test";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    auto w = TensorBoardWriter::open(dir);
    ASSERT_TRUE(w.ok()) << w.status().message();
    path = (*w)->path();
    ASSERT_TRUE((*w)->write(1, 1000.5, {{"reward/mean", 0.25}, {"loss", -1.5}}).ok());
    ASSERT_TRUE((*w)->write(300, 1001.0, {{"eval/accuracy", 0.75}}).ok());
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto recs = unframe(bytes);
  ASSERT_EQ(recs.size(), 3u);

  auto e0 = fields(recs[0]);
  ASSERT_EQ(e0.size(), 2u);
  EXPECT_EQ(e0[0].number, 1u);
  EXPECT_EQ(e0[0].wire, 1u);
  EXPECT_GT(as_double(e0[0].varint), 1.6e9);  // a real Unix time
  EXPECT_EQ(e0[1].number, 3u);
  EXPECT_EQ(e0[1].wire, 2u);
  EXPECT_EQ(e0[1].bytes, "brain.Event:2");

  auto e1 = fields(recs[1]);
  ASSERT_EQ(e1.size(), 3u);
  EXPECT_EQ(e1[0].number, 1u);
  EXPECT_EQ(as_double(e1[0].varint), 1000.5);
  EXPECT_EQ(e1[1].number, 2u);
  EXPECT_EQ(e1[1].wire, 0u);
  EXPECT_EQ(e1[1].varint, 1u);
  EXPECT_EQ(e1[2].number, 5u);
  auto values = fields(e1[2].bytes);
  ASSERT_EQ(values.size(), 2u);
  const char* tags[] = {"reward/mean", "loss"};
  const float want[] = {0.25f, -1.5f};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(values[i].number, 1u);
    auto v = fields(values[i].bytes);
    ASSERT_EQ(v.size(), 2u);
    EXPECT_EQ(v[0].number, 1u);
    EXPECT_EQ(v[0].bytes, tags[i]);
    EXPECT_EQ(v[1].number, 2u);
    EXPECT_EQ(v[1].wire, 5u);
    EXPECT_EQ(as_float(v[1].varint), want[i]);
  }
  auto e2 = fields(recs[2]);
  ASSERT_EQ(e2.size(), 3u);
  EXPECT_EQ(e2[1].varint, 300u);  // multi-byte varint: 0xAC 0x02
}

TEST(TensorBoard, FrameLayout) {
  // Hand-derived: a 3-byte payload gives 8 + 4 + 3 + 4 bytes, length field = 3 little endian.
  std::string r = tfrecord_frame("abc");
  ASSERT_EQ(r.size(), 19u);
  EXPECT_EQ(le(r, 0, 8), 3u);
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(le(r, 15, 4), ref_mask(ref_crc32c("abc")));
  EXPECT_EQ(crc32c_mask(0), 0xa282ead8u);
}

// (step, first value) of each event of a file, decoded independently; the
// file_version record reads as step -1.
std::vector<std::pair<int64_t, float>> file_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::pair<int64_t, float>> out;
  for (const auto& rec : unframe(bytes)) {
    int64_t step = 0;
    float value = 0;
    bool header = false;
    for (const auto& f : fields(rec)) {
      if (f.number == 2) step = int64_t(f.varint);
      if (f.number == 3) header = true;
      if (f.number == 5) value = as_float(fields(fields(f.bytes).at(0).bytes).at(1).varint);
    }
    out.emplace_back(header ? -1 : step, value);
  }
  return out;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& de : std::filesystem::directory_iterator(dir)) out.push_back(de.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

using Events = std::vector<std::pair<int64_t, float>>;

TEST(TensorBoard, ResumedRunKeepsOneFileWithoutRepeatedSteps) {
  const std::string dir = testing::TempDir() + "tb_resume";
  std::filesystem::remove_all(dir);
  {
    auto w = TensorBoardWriter::open_run(dir, -1);
    ASSERT_TRUE(w.ok()) << w.status().message();
    for (int s = 0; s <= 5; ++s) ASSERT_TRUE((*w)->write(s, 1000 + s, {{"loss", float(s)}}).ok());
  }
  const std::vector<std::string> first = files_in(dir);
  ASSERT_EQ(first.size(), 1u);
  {
    // Resumed from a checkpoint at step 3: steps 4 and 5 of the killed run go, the new ones follow.
    auto w = TensorBoardWriter::open_run(dir, 3);
    ASSERT_TRUE(w.ok()) << w.status().message();
    EXPECT_EQ((*w)->path(), first[0]);
    for (int s = 4; s <= 6; ++s) ASSERT_TRUE((*w)->write(s, 2000 + s, {{"loss", 100.f + s}}).ok());
  }
  ASSERT_EQ(files_in(dir), first);
  EXPECT_EQ(file_events(first[0]),
            (Events{{-1, 0.f}, {0, 0.f}, {1, 1.f}, {2, 2.f}, {3, 3.f}, {4, 104.f}, {5, 105.f}, {6, 106.f}}));

  // A record torn by a kill mid-write is dropped on the next resume.
  {
    std::ofstream(first[0], std::ios::binary | std::ios::app) << tfrecord_frame(tb_event_scalars(3000, 7, {{"loss", 7.f}})).substr(0, 20);
    auto w = TensorBoardWriter::open_run(dir, 6);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->write(7, 3000, {{"loss", 207.f}}).ok());
  }
  Events want = {{-1, 0.f}, {0, 0.f}, {1, 1.f}, {2, 2.f}, {3, 3.f}, {4, 104.f}, {5, 105.f}, {6, 106.f}, {7, 207.f}};
  EXPECT_EQ(file_events(first[0]), want);

  // A fresh run into the directory starts a new file and drops the old one.
  {
    auto w = TensorBoardWriter::open_run(dir, -1);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->write(1, 4000, {{"loss", 9.f}}).ok());
    ASSERT_EQ(files_in(dir).size(), 1u);
    EXPECT_EQ(file_events((*w)->path()), (Events{{-1, 0.f}, {1, 9.f}}));
  }
  std::filesystem::remove_all(dir);
}

// Directories from before: one file per process, the later one repeating steps
// after a resume. They merge into the oldest file, the later file winning.
TEST(TensorBoard, ResumeMergesEarlierPerProcessFiles) {
  const std::string dir = testing::TempDir() + "tb_merge";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write_file = [&](const std::string& name, int from, int to, float base) {
    std::string bytes = tfrecord_frame(tb_event_file_version(1000));
    for (int s = from; s <= to; ++s) bytes += tfrecord_frame(tb_event_scalars(1000 + s, s, {{"loss", base + s}}));
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  // Time stamps order the files (9 < 10 although "10" sorts first as text).
  write_file("events.out.tfevents.9.host.11.0", 1, 5, 0.f);
  write_file("events.out.tfevents.10.host.12.0", 4, 8, 100.f);
  {
    auto w = TensorBoardWriter::open_run(dir, 6);
    ASSERT_TRUE(w.ok()) << w.status().message();
    EXPECT_EQ((*w)->path(), dir + "/events.out.tfevents.9.host.11.0");
  }
  ASSERT_EQ(files_in(dir), std::vector<std::string>{dir + "/events.out.tfevents.9.host.11.0"});
  EXPECT_EQ(file_events(dir + "/events.out.tfevents.9.host.11.0"),
            (Events{{-1, 0.f}, {1, 1.f}, {2, 2.f}, {3, 3.f}, {4, 104.f}, {5, 105.f}, {6, 106.f}}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace grpo
