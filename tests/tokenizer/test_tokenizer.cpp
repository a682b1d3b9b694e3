// Tokenizer behaviour that needs no Python fixture: special tokens, round trips,
// incremental decoding, the SentencePiece-style BPE path (tiny tokenizer.json with
// hand-derived ids), and error reporting.
#include <utf8proc.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tok_test_util.h"
#include "tokenizer/unicode.h"

namespace grpo::test {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<std::string> stress_texts() {
  auto j = json::parse(read_file(fixture_dir() + "/stress_texts.json"));
  return j["texts"].get<std::vector<std::string>>();
}

// NFC by utf8proc directly (the reference for Qwen2's normalizer), independent of our spans.
std::string nfc(const std::string& s) {
  utf8proc_uint8_t* p = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &p,
                        utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string out(reinterpret_cast<char*>(p), size_t(n));
  std::free(p);
  return out;
}

TEST(Tokenizer, SpecialTokensAndIds) {
  const Tokenizer& q = tok("qwen2");
  EXPECT_EQ(q.encode("<|im_start|>user\nhi<|im_end|>"), (std::vector<int>{151644, 872, 198, 6023, 151645}));
  EXPECT_EQ(q.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(q.id_to_token(151644), "<|im_start|>");
  EXPECT_TRUE(q.is_special(151643));
  EXPECT_FALSE(q.is_special(872));
  EXPECT_EQ(q.vocab_size(), 151646);
  EXPECT_EQ(q.bos_id(), -1);
  EXPECT_EQ(q.eos_id(), 151645);
  EXPECT_EQ(q.decode({151644, 872, 198, 6023, 151645}, true), "user\nhi");
  const Tokenizer& l = tok("llama3");
  EXPECT_EQ(l.bos_id(), 128000);
  EXPECT_EQ(l.eos_id(), 128009);
  EXPECT_EQ(l.eos_ids(), (std::vector<int>{128001, 128008, 128009}));
  EXPECT_TRUE(l.add_bos());
  auto ids = l.encode("Hello world", true);
  EXPECT_EQ(ids, (std::vector<int>{128000, 9906, 1917}));  // ids as in llama3/parity ("Hello world")
  EXPECT_EQ(l.token_to_id("<|reserved_special_token_247|>"), 128255);
  EXPECT_EQ(l.vocab_size(), 128256);
  const Tokenizer& g = tok("gpt2");
  EXPECT_EQ(g.encode("a<|endoftext|>b"), (std::vector<int>{64, 50256, 65}));
  EXPECT_EQ(g.vocab_size(), 50257);
}

TEST(Tokenizer, StressRoundTrip) {
  for (const char* name : {"gpt2", "qwen2", "llama3"}) {
    for (const std::string& s : stress_texts()) {
      std::string want = std::string(name) == "qwen2" ? nfc(s) : s;
      EXPECT_EQ(tok(name).decode(tok(name).encode(s)), want) << name << ": " << s;
    }
  }
}

TEST(Tokenizer, IncrementalDecodeEmitsOnlyCompleteUtf8) {
  std::vector<std::string> texts = stress_texts();
  for (auto& c : parity_cases("qwen2")) texts.push_back(c.text);
  for (const char* name : {"gpt2", "qwen2", "llama3"}) {
    const Tokenizer& t = tok(name);
    for (const std::string& s : texts) {
      std::vector<int> ids = t.encode(s);
      IncrementalDecoder dec(t);
      std::string all;
      for (int id : ids) {
        std::string piece = dec.push(id);
        EXPECT_EQ(utf8_first_invalid(piece), std::string::npos) << name << ": broken UTF-8 emitted for " << s;
        all += piece;
      }
      all += dec.flush();
      EXPECT_EQ(all, t.decode(ids)) << name << ": " << s;
    }
  }
  // An emoji that GPT-2 splits into byte tokens is held back until complete.
  const Tokenizer& g = tok("gpt2");
  std::vector<int> ids = g.encode("\xF0\x9F\x98\x80");  // U+1F600
  ASSERT_GT(ids.size(), 1u);
  IncrementalDecoder dec(g);
  for (size_t k = 0; k + 1 < ids.size(); ++k) EXPECT_EQ(dec.push(ids[k]), "");
  EXPECT_EQ(dec.push(ids.back()), "\xF0\x9F\x98\x80");
  // A truncated sequence at the end becomes U+FFFD, as in decode().
  IncrementalDecoder dec2(g);
  EXPECT_EQ(dec2.push(ids[0]), "");
  EXPECT_EQ(dec2.flush(), g.decode({ids[0]}));
  EXPECT_EQ(g.decode({ids[0]}), "\xEF\xBF\xBD");
}

TEST(Tokenizer, CheckedApisReportErrors) {
  const Tokenizer& q = tok("qwen2");
  auto d = q.decode_checked({1, 200000});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("200000"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("151646"), std::string::npos) << d.status().message();
  EXPECT_EQ(q.decode({9707, 200000, -1}), q.decode({9707}));  // unchecked: skipped like HF
  auto e = q.encode_checked("ok \xFF bad");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("offset 3"), std::string::npos) << e.status().message();
  EXPECT_TRUE(q.encode_checked("fine").ok());
}

struct TempDir {
  fs::path p;
  TempDir() {
    p = fs::temp_directory_path() / ("grpo_tok_test_" + std::to_string(::getpid()) + "_" + std::to_string(rand()));
    fs::create_directories(p);
  }
  ~TempDir() { fs::remove_all(p); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream((p / name).string(), std::ios::binary) << text;
    return (p / name).string();
  }
};

std::string load_error(const std::string& path, const TokenizerOptions& opt = {}) {
  auto r = Tokenizer::load(path, opt);
  return r.ok() ? std::string("(loaded)") : r.status().message();
}

// A Llama-2-style tokenizer.json. Vocab: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>
// (ids 3..258), then ▁ h e l o ▁h ll ▁he llo ▁hello w.
json tiny_sp(bool metaspace) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    vocab[hex] = 3 + b;
  }
  const char* rest[] = {"\xE2\x96\x81", "h", "e", "l", "o", "\xE2\x96\x81h", "ll", "\xE2\x96\x81he", "llo", "\xE2\x96\x81hello", "w"};
  for (int k = 0; k < 11; ++k) vocab[rest[k]] = 259 + k;
  json j = {{"version", "1.0"},
            {"added_tokens", {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                              {{"id", 1}, {"content", "<s>"}, {"special", true}},
                              {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"byte_fallback", true},
                       {"fuse_unk", true}, {"vocab", vocab},
                       {"merges", {"\xE2\x96\x81 h", "l l", "\xE2\x96\x81h e", "ll o", "\xE2\x96\x81he llo"}}}},
            {"post_processor", {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                                {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}}};
  if (metaspace) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"add_prefix_space", true}};
    j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}},
                                                        {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"add_prefix_space", true}}}}};
  } else {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                                              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                                        {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  }
  return j;
}

TEST(Tokenizer, SentencePieceStyleBpe) {
  for (bool metaspace : {false, true}) {
    TempDir d;
    auto r = Tokenizer::load(d.write("tokenizer.json", tiny_sp(metaspace).dump()));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const Tokenizer& t = r.value();
    // "hello" -> "▁hello": ▁+h (rank 0), l+l (1), ▁h+e (2), ll+o (3), ▁he+llo (4) -> 268.
    EXPECT_EQ(t.encode("hello"), std::vector<int>{268});
    EXPECT_EQ(t.encode("hello hello"), (std::vector<int>{268, 268}));
    // "hi" -> "▁hi": ▁h (264), then 'i' is not in the vocab -> byte fallback <0x69> = 3 + 0x69.
    EXPECT_EQ(t.encode("hi"), (std::vector<int>{264, 3 + 0x69}));
    // 'é' = C3 A9 -> two byte tokens; "w" is in the vocab.
    EXPECT_EQ(t.encode("w\xC3\xA9"), (std::vector<int>{259, 269, 3 + 0xC3, 3 + 0xA9}));
    EXPECT_EQ(t.encode("hello", true), (std::vector<int>{1, 268}));
    EXPECT_EQ(t.bos_id(), -1);  // no tokenizer_config.json: no named bos
    EXPECT_EQ(t.decode({268, 268}), "hello hello");  // leading space stripped once
    EXPECT_EQ(t.decode({264, 3 + 0x69}), "hi");
    EXPECT_EQ(t.decode({259, 269, 3 + 0xC3, 3 + 0xA9}), "w\xC3\xA9");
    EXPECT_EQ(t.decode({1, 268}), "<s> hello");
    EXPECT_EQ(t.decode({1, 268}, true), "hello");
    IncrementalDecoder dec(t);
    std::string all;
    for (int id : {268, 268, 259, 269, 3 + 0xC3, 3 + 0xA9}) all += dec.push(id);
    EXPECT_EQ(all + dec.flush(), "hello hello w\xC3\xA9");
  }
}

TEST(Tokenizer, AddedTokenStripFlags) {
  // <mask> = 270. The text around it is normalized per segment (Prepend ▁, spaces -> ▁):
  // "hello " -> "▁hello▁" -> 268 259; " hello" -> "▁▁hello" -> 259 268 (▁ + ▁hello);
  // "hello" -> 268. lstrip gives the space before <mask> to the token, rstrip the one after.
  for (int mode = 0; mode < 3; ++mode) {
    json j = tiny_sp(false);
    j["added_tokens"].push_back({{"id", 270}, {"content", "<mask>"}, {"special", true}, {"normalized", false},
                                 {"lstrip", mode == 1}, {"rstrip", mode == 2}});
    TempDir d;
    auto r = Tokenizer::load(d.write("tokenizer.json", j.dump()));
    ASSERT_TRUE(r.ok()) << r.status().message();
    auto ids = r.value().encode("hello <mask> hello");
    if (mode == 0) EXPECT_EQ(ids, (std::vector<int>{268, 259, 270, 259, 268}));
    if (mode == 1) EXPECT_EQ(ids, (std::vector<int>{268, 270, 259, 268}));
    if (mode == 2) EXPECT_EQ(ids, (std::vector<int>{268, 259, 270, 268}));
    EXPECT_EQ(r.value().encode("hello<mask>hello"), (std::vector<int>{268, 270, 268}));
  }
}

TEST(Tokenizer, Gpt2EncoderJsonVocabBpeForm) {
  TempDir d;
  for (const char* f : {"encoder.json", "vocab.bpe"}) fs::copy_file(tok_dir("gpt2") + "/" + f, d.p / f);
  TokenizerOptions o;
  o.preset = "gpt2";
  auto r = Tokenizer::load(d.p.string(), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (auto& c : parity_cases("gpt2")) EXPECT_EQ(r.value().encode(c.text), c.ids) << c.text;
  EXPECT_EQ(r.value().eos_id(), 50256);
  EXPECT_EQ(r.value().encode("x<|endoftext|>"), (std::vector<int>{87, 50256}));
}

TEST(Tokenizer, LoadErrorsNameTheProblem) {
  TempDir d;
  std::string bad = d.write("broken.json", "{\"model\": {\"type\": \"BPE\", ");
  std::string m = load_error(bad);
  EXPECT_NE(m.find("malformed JSON"), std::string::npos) << m;
  EXPECT_NE(m.find(bad), std::string::npos) << m;

  json wp = tiny_sp(false);
  wp["model"]["type"] = "WordPiece";
  m = load_error(d.write("wp.json", wp.dump()));
  EXPECT_NE(m.find("unsupported model type 'WordPiece'"), std::string::npos) << m;
  EXPECT_NE(m.find("wp.json"), std::string::npos) << m;

  json ws = tiny_sp(false);
  ws["pre_tokenizer"] = {{"type", "Whitespace"}};
  m = load_error(d.write("ws.json", ws.dump()));
  EXPECT_NE(m.find("unsupported pre-tokenizer type 'Whitespace'"), std::string::npos) << m;

  json lc = tiny_sp(false);
  lc["normalizer"] = {{"type", "Lowercase"}};
  m = load_error(d.write("lc.json", lc.dump()));
  EXPECT_NE(m.find("unsupported normalizer type 'Lowercase'"), std::string::npos) << m;

  json dec = tiny_sp(false);
  dec["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  m = load_error(d.write("dec.json", dec.dump()));
  EXPECT_NE(m.find("unsupported decoder"), std::string::npos) << m;

  json mg = tiny_sp(false);
  mg["model"]["merges"].push_back("x y");
  m = load_error(d.write("mg.json", mg.dump()));
  EXPECT_NE(m.find("merge #5 \"x y\""), std::string::npos) << m;

  m = load_error(tok_dir("llama3"));  // vocab/merges form without a preset
  EXPECT_NE(m.find("preset"), std::string::npos) << m;
  TokenizerOptions o;
  o.preset = "llama4";
  m = load_error(tok_dir("llama3"), o);
  EXPECT_NE(m.find("unknown tokenizer preset 'llama4'"), std::string::npos) << m;
  m = load_error(tok_dir("nonexistent"));
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
}

TEST(Tokenizer, QwenVocabMergesFormMatchesTokenizerJson) {
  // The same vocabulary loaded from vocab.json + merges.txt with the qwen2 preset must
  // tokenize exactly like the tokenizer.json (checked on the parity strings).
  TempDir d;
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    fs::copy_file(tok_dir("qwen2") + "/" + f, d.p / f);
  TokenizerOptions o;
  o.preset = "qwen2";
  auto r = Tokenizer::load(d.p.string(), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (auto& c : parity_cases("qwen2")) EXPECT_EQ(r.value().encode(c.text), c.ids) << c.text;
  EXPECT_EQ(r.value().encode("<|im_start|>x"), tok("qwen2").encode("<|im_start|>x"));
  EXPECT_EQ(r.value().eos_id(), 151645);
}

}  // namespace grpo::test
