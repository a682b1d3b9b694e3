// Tokenizer::load: finds the files, reads the vocab/merges form (with an explicit
// preset; nothing is guessed), applies tokenizer_config.json / chat_template.jinja /
// generation_config.json, and builds the BPE tables and per-id decode bytes.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_load.h"

namespace grpo {

using json = nlohmann::json;
namespace fs = std::filesystem;

Result<TokenizerOptions> preset_options(const std::string& name) {
  TokenizerOptions o;
  o.preset = name;
  o.ignore_merges = false;
  o.nfc = false;
  if (name == "gpt2") {
    o.pattern = kGpt2Pattern;
    o.added_tokens.push_back({50256, "<|endoftext|>"});
    o.bos_token = o.eos_token = "<|endoftext|>";
    o.add_bos = false;
  } else if (name == "qwen2") {
    o.pattern = kQwen2Pattern;
    o.nfc = true;  // special tokens come from the folder's tokenizer_config.json / added_tokens.json
  } else if (name == "llama3") {
    o.pattern = kLlama3Pattern;
    o.ignore_merges = true;
    const std::pair<int, const char*> named[] = {
        {128000, "<|begin_of_text|>"}, {128001, "<|end_of_text|>"}, {128004, "<|finetune_right_pad_id|>"},
        {128006, "<|start_header_id|>"}, {128007, "<|end_header_id|>"}, {128008, "<|eom_id|>"},
        {128009, "<|eot_id|>"}, {128010, "<|python_tag|>"}};
    int reserved = 0;
    for (int id = 128000; id < 128256; ++id) {
      auto it = std::find_if(std::begin(named), std::end(named), [&](auto& p) { return p.first == id; });
      std::string content = it != std::end(named) ? it->second : "<|reserved_special_token_" + std::to_string(reserved++) + "|>";
      o.added_tokens.push_back({id, content});
    }
    o.bos_token = "<|begin_of_text|>";
    o.eos_token = "<|eot_id|>";
    o.extra_eos_tokens = {"<|end_of_text|>", "<|eom_id|>"};
    o.add_bos = true;
  } else {
    return error_status("unknown tokenizer preset '" + name + "' (known: gpt2, qwen2, llama3)");
  }
  return o;
}

namespace {

std::string token_name(const json& v) {  // "x", {"content": "x"} or null
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return "";
}

Status load_vocab_merges(const std::string& vocab_file, const std::string& merges_file, const TokenizerOptions& opt,
                         TokenizerImpl& t, ModelFiles& mf) {
  GRPO_ASSIGN_OR_RETURN(json v, read_json_file(vocab_file));
  if (!v.is_object()) return error_status(vocab_file + ": expected a JSON object token -> id");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer()) return error_status(vocab_file + ": id of '" + it.key() + "' is not an integer");
    mf.vocab.emplace_back(it.key(), it.value().get<int>());
  }
  GRPO_ASSIGN_OR_RETURN(std::string text, read_text_file(merges_file));
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    std::string line = text.substr(pos, e - pos);
    pos = e + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ', 1);
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      return error_status(merges_file + ":" + std::to_string(line_no) + ": expected a merge \"a b\", got \"" + line + "\"");
    mf.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  mf.ignore_merges = opt.ignore_merges.value_or(false);
  mf.decode_byte_level = true;
  if (opt.nfc.value_or(false)) {
    NormStep nfc;
    nfc.form = NormForm::nfc;
    t.normalizer.push_back(nfc);
  }
  PreTokStep split;
  GRPO_ASSIGN_OR_RETURN(split.re, Regex::compile(*opt.pattern, false));
  t.pre.steps.push_back(split);
  PreTokStep bl;
  bl.kind = PreTokStep::byte_level;
  t.pre.steps.push_back(bl);
  return ok_status();
}

void add_or_replace(std::vector<AddedToken>& added, const AddedToken& a) {
  for (auto& x : added)
    if (x.id == a.id || x.content == a.content) { x = a; return; }
  added.push_back(a);
}

// tokenizer_config.json (chat template, bos/eos, add_bos_token, added_tokens_decoder),
// chat_template.jinja and generation_config.json, when present in dir.
Status apply_folder_config(const fs::path& dir, bool vocab_form, TokenizerImpl& t, std::vector<int>* gen_eos,
                           std::optional<bool>* add_bos) {
  fs::path cfg = dir / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    GRPO_ASSIGN_OR_RETURN(json c, read_json_file(cfg.string()));
    try {
      if (c.contains("chat_template")) {
        const json& ct = c["chat_template"];
        if (ct.is_string()) t.chat_template = ct.get<std::string>();
        for (const json& e : ct.is_array() ? ct : json::array())
          if (e.value("name", "") == "default") t.chat_template = e["template"].get<std::string>();
      }
      if (c.contains("added_tokens_decoder")) {
        for (auto it = c["added_tokens_decoder"].begin(); it != c["added_tokens_decoder"].end(); ++it) {
          int id = std::stoi(it.key());
          bool known = std::any_of(t.added.begin(), t.added.end(), [&](auto& a) { return a.id == id; });
          AddedToken a;
          a.id = id;
          a.content = it.value()["content"].get<std::string>();
          a.special = it.value().value("special", false);
          a.normalized = it.value().value("normalized", !a.special);
          a.lstrip = it.value().value("lstrip", false);
          a.rstrip = it.value().value("rstrip", false);
          a.single_word = it.value().value("single_word", false);
          if (!known) t.added.push_back(a);
        }
      }
      if (c.contains("bos_token")) t.bos_token = token_name(c["bos_token"]);
      if (c.contains("eos_token")) t.eos_token = token_name(c["eos_token"]);
      if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) *add_bos = c["add_bos_token"].get<bool>();
    } catch (const std::exception& e) {
      return error_status(cfg.string() + ": unexpected structure: " + e.what());
    }
  }
  fs::path added_json = dir / "added_tokens.json";
  if (vocab_form && fs::exists(added_json)) {
    GRPO_ASSIGN_OR_RETURN(json a, read_json_file(added_json.string()));
    for (auto it = a.begin(); it != a.end(); ++it)
      if (std::none_of(t.added.begin(), t.added.end(), [&](auto& x) { return x.content == it.key(); }))
        t.added.push_back({it.value().get<int>(), it.key(), false, false});
  }
  fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    GRPO_ASSIGN_OR_RETURN(t.chat_template, read_text_file(jinja.string()));
  }
  fs::path gen = dir / "generation_config.json";
  if (fs::exists(gen)) {
    GRPO_ASSIGN_OR_RETURN(json g, read_json_file(gen.string()));
    const json e = g.value("eos_token_id", json());
    if (e.is_number_integer()) gen_eos->push_back(e.get<int>());
    for (const json& x : e.is_array() ? e : json::array()) gen_eos->push_back(x.get<int>());
  }
  return ok_status();
}

Status build_model(TokenizerImpl& t, const ModelFiles& mf) {
  const std::string& file = t.source;
  BpeModel& m = t.model;
  m.byte_level = std::any_of(t.pre.steps.begin(), t.pre.steps.end(), [](auto& s) { return s.kind == PreTokStep::byte_level; });
  if (m.byte_level != mf.decode_byte_level)
    return error_status(file + ": ByteLevel pre-tokenizer and ByteLevel decoder must come together (unsupported mix)");
  m.byte_fallback = mf.byte_fallback;
  m.ignore_merges = mf.ignore_merges;
  m.fuse_unk = mf.fuse_unk;
  int max_id = -1;
  m.vocab.reserve(mf.vocab.size());
  for (auto& [tok, id] : mf.vocab) {
    if (id < 0) return error_status(file + ": negative id for token '" + tok + "'");
    m.vocab.emplace(tok, id);
    max_id = std::max(max_id, id);
  }
  for (auto& a : t.added) max_id = std::max(max_id, a.id);
  t.id_to_token.assign(max_id + 1, "");
  for (auto& [tok, id] : mf.vocab) t.id_to_token[id] = tok;
  for (auto& a : t.added) t.id_to_token[a.id] = a.content;
  if (!mf.unk_token.empty()) {
    auto it = m.vocab.find(mf.unk_token);
    if (it == m.vocab.end()) return error_status(file + ": unk_token '" + mf.unk_token + "' is not in the vocabulary");
    m.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    auto it = m.vocab.find(m.byte_level ? byte_to_unicode(uint8_t(b)) : std::string(hex));
    m.byte_ids[b] = it != m.vocab.end() && (m.byte_level || m.byte_fallback) ? it->second : -1;
  }
  auto raw_bytes = [](const std::string& tok, std::string& out) {  // byte-level text -> bytes
    out.clear();
    bool all = true;
    for (size_t i = 0; i < tok.size();) {
      size_t n = utf8_seq_len(tok, i);
      if (n == 0) n = 1;
      uint32_t cp = uint8_t(tok[i]) & (n == 1 ? 0x7F : n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(tok[i + k]) & 0x3F);
      int b = unicode_to_byte(cp);
      if (b >= 0) out.push_back(char(b));
      else { out.append(tok, i, n); all = false; }
      i += n;
    }
    return all;
  };
  std::string tmp;
  if (m.byte_level && m.ignore_merges)
    for (auto& [tok, id] : mf.vocab)
      if (raw_bytes(tok, tmp)) m.raw_vocab.emplace(tmp, id);
  m.merges.reserve(mf.merges.size());
  for (size_t r = 0; r < mf.merges.size(); ++r) {
    auto& [a, b] = mf.merges[r];
    auto ia = m.vocab.find(a), ib = m.vocab.find(b), im = m.vocab.find(a + b);
    if (ia == m.vocab.end() || ib == m.vocab.end() || im == m.vocab.end())
      return error_status(file + ": merge #" + std::to_string(r) + " \"" + a + " " + b +
                          "\" uses or makes a token that is not in the vocabulary");
    // Later duplicates win, as in HF's HashMap construction.
    m.merges.insert_or_assign((uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second),
                              (uint64_t(r) << 32) | uint32_t(im->second));
  }
  t.special.assign(max_id + 1, 0);
  t.id_bytes.assign(max_id + 1, "");
  for (auto& [tok, id] : mf.vocab) {
    std::string& out = t.id_bytes[id];
    if (m.byte_level) { raw_bytes(tok, out); continue; }
    out = tok;
    for (auto& [from, to] : mf.decode_replace)
      for (size_t p = out.find(from); p != std::string::npos; p = out.find(from, p + to.size())) out.replace(p, from.size(), to);
    unsigned v;
    if (mf.decode_byte_fallback && out.size() == 6 && std::sscanf(out.c_str(), "<0x%2X>", &v) == 1) out = std::string(1, char(v));
  }
  for (auto& a : t.added) {
    t.id_bytes[a.id] = a.content;  // added tokens decode to their text as written
    t.special[a.id] = a.special;
  }
  t.finish_added();
  return ok_status();
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& path, const TokenizerOptions& opt) {
  auto t = std::make_shared<TokenizerImpl>();
  ModelFiles mf;
  fs::path p(path), dir;
  bool vocab_form = false;
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    dir = p;
    if (fs::exists(p / "tokenizer.json")) {
      t->source = (p / "tokenizer.json").string();
    } else {
      for (auto [v, mg] : {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}})
        if (fs::exists(p / v) && fs::exists(p / mg)) {
          t->source = (p / v).string() + " + " + (p / mg).string();
          vocab_form = true;
          break;
        }
      if (t->source.empty())
        return error_status(path + ": no tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe in this directory");
    }
  } else if (fs::exists(p, ec)) {
    dir = p.parent_path();
    t->source = path;
  } else {
    return error_status("tokenizer path " + path + " does not exist");
  }
  TokenizerOptions eff = opt;
  if (!opt.preset.empty()) {
    if (!vocab_form)
      return error_status(t->source + ": a tokenizer preset ('" + opt.preset +
                          "') only applies to the vocab/merges form; tokenizer.json says how to pre-tokenize");
    GRPO_ASSIGN_OR_RETURN(eff, preset_options(opt.preset));
    if (opt.pattern) eff.pattern = opt.pattern;
    if (opt.ignore_merges) eff.ignore_merges = opt.ignore_merges;
    if (opt.nfc) eff.nfc = opt.nfc;
    for (auto& a : opt.added_tokens) add_or_replace(eff.added_tokens, a);
    if (!opt.bos_token.empty()) eff.bos_token = opt.bos_token;
    if (!opt.eos_token.empty()) eff.eos_token = opt.eos_token;
    if (opt.add_bos) eff.add_bos = opt.add_bos;
    for (auto& e : opt.extra_eos_tokens) eff.extra_eos_tokens.push_back(e);
  }
  if (vocab_form) {
    if (!eff.pattern)
      return error_status(t->source + ": the vocab/merges form does not say how to pre-tokenize; pass a preset "
                                      "(gpt2, qwen2 or llama3; CLI: --preset) or a pattern. Nothing is guessed.");
    auto files = t->source;
    size_t plus = files.find(" + ");
    GRPO_TRY(load_vocab_merges(files.substr(0, plus), files.substr(plus + 3), eff, *t, mf));
  } else {
    if (opt.pattern || opt.ignore_merges || opt.nfc)
      return error_status(t->source + ": pattern/ignore_merges/nfc options only apply to the vocab/merges form");
    GRPO_TRY(load_tokenizer_json(t->source, *t, mf));
  }
  std::vector<int> gen_eos;
  std::optional<bool> config_add_bos;
  GRPO_TRY(apply_folder_config(dir, vocab_form, *t, &gen_eos, &config_add_bos));
  for (auto& a : eff.added_tokens) add_or_replace(t->added, a);
  if (!eff.bos_token.empty()) t->bos_token = eff.bos_token;
  if (!eff.eos_token.empty()) t->eos_token = eff.eos_token;
  GRPO_TRY(build_model(*t, mf));
  Tokenizer tok(t);
  auto resolve = [&](const std::string& name, int* id, const char* what) -> Status {
    if (name.empty()) return ok_status();
    auto v = tok.token_to_id(name);
    if (!v) return error_status(t->source + ": " + what + " '" + name + "' is not in the vocabulary");
    *id = *v;
    return ok_status();
  };
  GRPO_TRY(resolve(t->bos_token, &t->bos_id, "bos token"));
  GRPO_TRY(resolve(t->eos_token, &t->eos_id, "eos token"));
  // add_bos: explicit option > tokenizer_config add_bos_token > the post-processor.
  std::optional<bool> want_bos = eff.add_bos ? eff.add_bos : config_add_bos;
  if (want_bos && *want_bos && t->bos_id < 0) return error_status(t->source + ": add_bos requested but there is no bos token");
  if (want_bos) {
    auto& pre = t->prefix_ids;
    pre.erase(std::remove(pre.begin(), pre.end(), t->bos_id), pre.end());
    if (*want_bos) pre.insert(pre.begin(), t->bos_id);
  }
  t->add_bos = t->bos_id >= 0 && !t->prefix_ids.empty() && t->prefix_ids.front() == t->bos_id;
  if (t->eos_id >= 0) t->eos_ids.push_back(t->eos_id);
  for (int id : gen_eos) t->eos_ids.push_back(id);
  for (auto& name : eff.extra_eos_tokens) {
    int id = -1;
    GRPO_TRY(resolve(name, &id, "eos token"));
    t->eos_ids.push_back(id);
  }
  std::sort(t->eos_ids.begin(), t->eos_ids.end());
  t->eos_ids.erase(std::unique(t->eos_ids.begin(), t->eos_ids.end()), t->eos_ids.end());
  return tok;
}

}  // namespace grpo
