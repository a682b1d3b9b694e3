// safetensors reader/writer: round trips of every dtype, files built byte by
// byte from the documented format (as the Python library writes them), and
// every kind of corrupt input with the message it must produce.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "test_util.h"

using namespace grpo;
namespace fs = std::filesystem;

namespace {

// Independent writer: u64 LE header length, header JSON (space padded to 8), data.
std::string st_bytes(std::string header, const std::string& data, bool pad = true) {
  while (pad && header.size() % 8) header.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string open_error(const std::string& path) {
  auto r = SafetensorsFile::open(path);
  EXPECT_FALSE(r.ok()) << path << " opened although it is corrupt";
  return r.ok() ? "" : r.status().message();
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir tmp;
  std::vector<float> f = {1.f, -2.5f, 3.25f, 1e-3f, 65504.f, -0.f};
  std::vector<uint16_t> bf = {0x3f80, 0xc020, 0x4049, 0x0001};  // 1, -2.5, 3.140625, tiny subnormal
  std::vector<uint16_t> hf = {0x3c00, 0x7bff, 0xb554};          // 1, 65504, -0.333
  std::vector<int32_t> i32 = {7, -8, 2147483647};
  std::vector<int64_t> i64 = {int64_t(1) << 40, -5};
  std::vector<SafetensorsWriteItem> items = {
      {"f32", tensor_borrow(f.data(), DType::f32, Device::cpu, {2, 3}), DType::f32, {}},
      {"bf16", tensor_borrow(bf.data(), DType::bf16, Device::cpu, {4}), DType::bf16, {}},
      {"f16", tensor_borrow(hf.data(), DType::f16, Device::cpu, {1, 3}), DType::f16, {}},
      {"i32", tensor_borrow(i32.data(), DType::i32, Device::cpu, {3}), DType::i32, {}},
      {"i64", tensor_borrow(i64.data(), DType::i64, Device::cpu, {2, 1}), DType::i64, {}},
  };
  std::string path = tmp.path + "/x.safetensors";
  ASSERT_TRUE(safetensors_write(path, items, {{"format", "pt"}, {"step", "3"}}).ok());
  for (const auto& e : fs::directory_iterator(tmp.path)) EXPECT_EQ(e.path().filename(), "x.safetensors");

  // Header length is a multiple of 8, as HF pads it.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);

  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SafetensorsFile& sf = r.value();
  EXPECT_EQ(sf.metadata().at("format"), "pt");
  EXPECT_EQ(sf.metadata().at("step"), "3");
  EXPECT_EQ(sf.entries().size(), 5u);
  auto t = sf.tensor("f32").value();
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_TRUE(t.owner != nullptr);  // borrows the mapping, keeps it alive
  EXPECT_EQ(std::memcmp(t.data, f.data(), f.size() * 4), 0);
  EXPECT_EQ(std::memcmp(sf.tensor("bf16").value().data, bf.data(), bf.size() * 2), 0);
  EXPECT_EQ(std::memcmp(sf.tensor("f16").value().data, hf.data(), hf.size() * 2), 0);
  EXPECT_EQ(std::memcmp(sf.tensor("i32").value().data, i32.data(), i32.size() * 4), 0);
  EXPECT_EQ(std::memcmp(sf.tensor("i64").value().data, i64.data(), i64.size() * 8), 0);
  EXPECT_EQ(sf.tensor("i64").value().dtype, DType::i64);
  // Zero-copy view outlives the file object.
  Tensor keep;
  {
    auto r2 = SafetensorsFile::open(path);
    keep = r2.value().tensor("i32").value();
  }
  EXPECT_EQ(keep.ptr<int32_t>()[2], 2147483647);
  // Converted reads.
  auto bf_as_f32 = sf.tensor_as("bf16", DType::f32).value();
  EXPECT_EQ(bf_as_f32.ptr<float>()[1], -2.5f);
  EXPECT_EQ(bf_as_f32.ptr<float>()[2], 3.140625f);
  EXPECT_FALSE(sf.tensor_as("i32", DType::f32).ok());
}

TEST(Safetensors, WritesConvertedDtype) {
  TempDir tmp;
  std::vector<float> f = {1.f, -2.5f, 3.14159265f};
  std::string path = tmp.path + "/c.safetensors";
  ASSERT_TRUE(safetensors_write(path, {{"w", tensor_borrow(f.data(), DType::f32, Device::cpu, {3}), DType::bf16, {3, 1}}}).ok());
  auto sf = SafetensorsFile::open(path).value();
  auto t = sf.tensor("w").value();
  EXPECT_EQ(t.dtype, DType::bf16);
  EXPECT_EQ(t.ndim, 2);
  // bit patterns from torch.tensor([1.0, -2.5, 3.14159265]).bfloat16()
  EXPECT_EQ(t.ptr<uint16_t>()[0], 0x3f80);
  EXPECT_EQ(t.ptr<uint16_t>()[1], 0xc020);
  EXPECT_EQ(t.ptr<uint16_t>()[2], 0x4049);
}

TEST(Safetensors, ReadsFileBuiltFromTheSpec) {
  // What safetensors.torch.save_file({"a": torch.tensor([[1., -2.5], [3.25, .1]]),
  // "b": torch.tensor([1., -2.5, 3.14159], dtype=torch.bfloat16)}, metadata={"format": "pt"}) lays out.
  TempDir tmp;
  std::vector<float> a = {1.f, -2.5f, 3.25f, 0.1f};
  std::vector<uint16_t> b = {0x3f80, 0xc020, 0x4049};
  std::string hdr = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})";
  std::string path = tmp.write("spec.safetensors", st_bytes(hdr, raw(a) + raw(b)));
  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto ta = r.value().tensor_as("a", DType::f32).value();
  EXPECT_EQ(ta.dim(0), 2);
  EXPECT_EQ(ta.ptr<float>()[3], 0.1f);
  auto tb = r.value().tensor_as("b", DType::f32).value();
  EXPECT_EQ(tb.ptr<float>()[0], 1.f);
  EXPECT_EQ(tb.ptr<float>()[1], -2.5f);
  EXPECT_EQ(tb.ptr<float>()[2], 3.140625f);
  // A header without padding and without __metadata__ is valid too.
  std::string p2 = tmp.write("nopad.safetensors", st_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", raw(a), false));
  ASSERT_TRUE(SafetensorsFile::open(p2).ok());
  // Scalars and empty tensors.
  std::string p3 = tmp.write("scalar.safetensors",
                             st_bytes(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})",
                                      raw(std::vector<float>{7.f})));
  auto r3 = SafetensorsFile::open(p3);
  ASSERT_TRUE(r3.ok()) << r3.status().message();
  EXPECT_EQ(r3.value().tensor("s").value().ptr<float>()[0], 7.f);
  EXPECT_EQ(r3.value().tensor("e").value().numel(), 0);
}

TEST(Safetensors, RejectsCorruptFiles) {
  TempDir tmp;
  std::string d16(16, '\0');
  auto hdr1 = [](const char* dtype, const char* shape, const char* offs) {
    return std::string(R"({"w":{"dtype":")") + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offs + "}}";
  };
  EXPECT_NE(open_error(tmp.write("short", "abc")).find("too short"), std::string::npos);
  EXPECT_NE(open_error(tmp.path + "/absent").find("cannot open"), std::string::npos);
  {
    std::string b = st_bytes(hdr1("F32", "[4]", "[0,16]"), d16);
    b[0] = char(0xff);  // header length far beyond the file
    b[1] = char(0xff);
    EXPECT_NE(open_error(tmp.write("len", b)).find("beyond the file size"), std::string::npos);
  }
  EXPECT_NE(open_error(tmp.write("json", st_bytes(R"({"w": {"dtype": "F32", )", d16))).find("malformed header JSON"),
            std::string::npos);
  EXPECT_NE(open_error(tmp.write("dtype", st_bytes(hdr1("Q4", "[4]", "[0,16]"), d16))).find("dtype \"Q4\" is not supported"),
            std::string::npos);
  EXPECT_NE(open_error(tmp.write("range", st_bytes(hdr1("F32", "[8]", "[0,32]"), d16))).find("past the end of the data"),
            std::string::npos);
  EXPECT_NE(open_error(tmp.write("order", st_bytes(hdr1("F32", "[0]", "[16,0]"), d16))).find("begin > end"),
            std::string::npos);
  EXPECT_NE(open_error(tmp.write("size", st_bytes(hdr1("F32", "[3]", "[0,16]"), d16))).find("needs 12"),
            std::string::npos);
  std::string two = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  EXPECT_NE(open_error(tmp.write("overlap", st_bytes(two, d16))).find("overlap"), std::string::npos);
  EXPECT_NE(open_error(tmp.write("shape", st_bytes(hdr1("F32", "[-4]", "[0,16]"), d16))).find("non-negative"),
            std::string::npos);

  // A valid file cut short: the last tensor no longer fits.
  std::vector<float> v(64, 1.f);
  std::string good = tmp.path + "/good.safetensors";
  ASSERT_TRUE(safetensors_write(good, {{"w", tensor_borrow(v.data(), DType::f32, Device::cpu, {64}), DType::f32, {}}}).ok());
  fs::resize_file(good, fs::file_size(good) - 10);
  std::string msg = open_error(good);
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"w\""), std::string::npos) << msg;
  EXPECT_NE(msg.find(good), std::string::npos) << msg;
}

TEST(Safetensors, ShardedWriteAndCheckpointRead) {
  TempDir tmp;
  std::vector<float> a(100, 1.f), b(100, 2.f), c(10, 3.f);
  std::vector<SafetensorsWriteItem> items = {
      {"a", tensor_borrow(a.data(), DType::f32, Device::cpu, {100}), DType::f32, {}},
      {"b", tensor_borrow(b.data(), DType::f32, Device::cpu, {10, 10}), DType::f32, {}},
      {"c", tensor_borrow(c.data(), DType::f32, Device::cpu, {10}), DType::bf16, {}},
  };
  auto files = safetensors_write_sharded(tmp.path, items, {{"format", "pt"}}, 500);
  ASSERT_TRUE(files.ok()) << files.status().message();
  // 400 + 400 + 20 bytes with a 500-byte limit: {a}, {b, c}.
  ASSERT_EQ(files.value().size(), 3u);
  EXPECT_EQ(files.value()[0], "model-00001-of-00002.safetensors");
  auto idx = nlohmann::json::parse(read_file(tmp.path + "/model.safetensors.index.json").value());
  EXPECT_EQ(idx["metadata"]["total_size"], 820);
  EXPECT_EQ(idx["weight_map"]["c"], "model-00002-of-00002.safetensors");
  auto ck = SafetensorsCheckpoint::open(tmp.path);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck.value().files().size(), 2u);
  EXPECT_EQ(ck.value().names(), (std::vector<std::string>{"a", "b", "c"}));
  const SafetensorsFile* f = ck.value().file_of("c");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->tensor_as("c", DType::f32).value().ptr<float>()[9], 3.f);
  EXPECT_EQ(ck.value().file_of("zzz"), nullptr);

  // Unsharded: one model.safetensors.
  TempDir one;
  auto f1 = safetensors_write_sharded(one.path, items, {}, 0);
  ASSERT_TRUE(f1.ok());
  EXPECT_EQ(f1.value(), std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(SafetensorsCheckpoint::open(one.path).ok());

  // An index naming a missing shard, and a malformed index.
  tmp.write("model-00002-of-00002.safetensors", "");
  EXPECT_FALSE(SafetensorsCheckpoint::open(tmp.path).ok());
  tmp.write("model.safetensors.index.json", "{\"weight_map\": 3}");
  auto bad = SafetensorsCheckpoint::open(tmp.path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("malformed index"), std::string::npos);
  TempDir empty;
  auto none = SafetensorsCheckpoint::open(empty.path);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no model.safetensors"), std::string::npos);
}

TEST(Safetensors, DuplicateTensorAcrossShardsIsAnError) {
  TempDir tmp;
  std::vector<float> a(4, 1.f);
  auto item = SafetensorsWriteItem{"w", tensor_borrow(a.data(), DType::f32, Device::cpu, {4}), DType::f32, {}};
  ASSERT_TRUE(safetensors_write(tmp.path + "/x1.safetensors", {item}).ok());
  ASSERT_TRUE(safetensors_write(tmp.path + "/x2.safetensors", {item}).ok());
  auto r = SafetensorsCheckpoint::open(tmp.path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("appears in both"), std::string::npos);
}

namespace {

// Header JSON and data section of a file, split by the independent reading of the format.
struct StParts {
  std::string header, data;
};
StParts st_split(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  return {bytes.substr(8, n), bytes.substr(8 + n)};
}
std::string file_bytes(const std::string& path) { return read_file(path).value(); }

}  // namespace

// Files from the project's writer, then corrupted so that every offset still
// lies inside the data section and every size matches its shape: only the
// check that the offsets tile the data section exactly can catch them.
TEST(Safetensors, OffsetsMustTileTheDataSection) {
  TempDir tmp;
  std::vector<float> a = {1.f, 2.f, 3.f, 4.f}, b = {5.f, 6.f, 7.f, 8.f}, c = {9.f, 10.f};
  std::vector<SafetensorsWriteItem> items = {{"a", tensor_borrow(a.data(), DType::f32, Device::cpu, {4}), DType::f32, {}},
                                             {"b", tensor_borrow(b.data(), DType::f32, Device::cpu, {4}), DType::f32, {}},
                                             {"c", tensor_borrow(c.data(), DType::f32, Device::cpu, {2}), DType::f32, {}}};
  // Metadata of a length chosen so that the header carries >= 4 bytes of space padding.
  std::string good, bytes;
  for (int fill = 0; fill < 8; ++fill) {
    good = tmp.path + "/good" + std::to_string(fill) + ".safetensors";
    ASSERT_TRUE(safetensors_write(good, items, {{"note", std::string(size_t(fill), 'x')}}).ok());
    bytes = file_bytes(good);
    const std::string h = st_split(bytes).header;
    if (h.size() - (h.find_last_not_of(' ') + 1) >= 4) break;
  }
  const StParts parts = st_split(bytes);
  ASSERT_GE(parts.header.size() - (parts.header.find_last_not_of(' ') + 1), 4u) << parts.header;
  ASSERT_EQ(parts.data.size(), 40u);
  ASSERT_TRUE(SafetensorsFile::open(good).ok());

  // Header length lowered by 1..4 bytes: the JSON still parses, every tensor shifts.
  for (int k = 1; k <= 4; ++k) {
    std::string b2 = bytes;
    b2[0] = char(uint8_t(b2[0]) - k);  // header length < 256 here: the low byte holds it all
    ASSERT_EQ(uint8_t(bytes[1]), 0);
    const std::string p = tmp.write("lowered" + std::to_string(k) + ".safetensors", b2);
    const std::string msg = open_error(p);
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(k) + " bytes of the " + std::to_string(40 + k) + "-byte data section"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("\"c\""), std::string::npos) << "names the last tensor: " << msg;
    EXPECT_NE(msg.find("header length"), std::string::npos) << msg;
  }

  auto with_offsets = [&](const std::string& name, std::vector<std::pair<int, int>> offs, const std::string& data) {
    auto h = nlohmann::json::parse(parts.header);
    const char* names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; ++i) h[names[i]]["data_offsets"] = {offs[size_t(i)].first, offs[size_t(i)].second};
    return tmp.write(name, st_bytes(h.dump(), data));
  };
  // The unmodified layout rebuilt by the independent writer opens.
  ASSERT_TRUE(SafetensorsFile::open(with_offsets("same.safetensors", {{0, 16}, {16, 32}, {32, 40}}, parts.data)).ok());

  std::string p = with_offsets("overlap.safetensors", {{0, 16}, {12, 28}, {32, 40}}, parts.data);
  std::string msg = open_error(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"a\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"b\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;

  p = with_offsets("gap.safetensors", {{0, 16}, {20, 36}, {36, 44}}, parts.data + std::string(4, '\0'));
  msg = open_error(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor \"b\" begins at byte 20"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 bytes belong to no tensor"), std::string::npos) << msg;

  p = with_offsets("gap_first.safetensors", {{8, 24}, {24, 40}, {40, 48}}, parts.data + std::string(8, '\0'));
  msg = open_error(p);
  EXPECT_NE(msg.find("tensor \"a\" begins at byte 8"), std::string::npos) << msg;

  p = tmp.write("trailing.safetensors", bytes + std::string(8, '\0'));
  msg = open_error(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("8 bytes of the 48-byte data section"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"c\""), std::string::npos) << msg;

  // Empty tensors take no bytes; at the running offset they are fine, elsewhere they break the tiling.
  const std::string e_ok = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"e":{"dtype":"F32","shape":[0],"data_offsets":[16,16]}})";
  EXPECT_TRUE(SafetensorsFile::open(tmp.write("empty_ok.safetensors", st_bytes(e_ok, std::string(16, '\0')))).ok());
  const std::string e_bad = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})";
  EXPECT_NE(open_error(tmp.write("empty_bad.safetensors", st_bytes(e_bad, std::string(16, '\0')))).find("overlap"),
            std::string::npos);
  // No tensors at all: the data section must be empty.
  EXPECT_TRUE(SafetensorsFile::open(tmp.write("none.safetensors", st_bytes("{}", ""))).ok());
  EXPECT_NE(open_error(tmp.write("none_data.safetensors", st_bytes("{}", "xyz"))).find("without tensors"),
            std::string::npos);
}

// Files written by the Python library (HF checkpoints and PyTorch fixtures) keep opening.
TEST(Safetensors, ReferenceFilesStillOpen) {
  int n = 0;
  for (const char* dir : {"tests/fixtures", "models"})
    for (const auto& de : fs::recursive_directory_iterator(fs::path(GRPO_SOURCE_DIR) / dir))
      if (de.path().extension() == ".safetensors") {
        auto r = SafetensorsFile::open(de.path().string());
        EXPECT_TRUE(r.ok()) << r.status().message();
        ++n;
      }
  EXPECT_GE(n, 7) << "the HF model fixtures under tests/fixtures/models are expected";
}
