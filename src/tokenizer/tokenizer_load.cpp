// Tokenizer::load: reads tokenizer.json (HF tokenizers' serialization) or the
// vocab/merges form, then tokenizer_config.json / chat_template.jinja /
// generation_config.json next to it. Every component type is checked against what
// the pipeline implements; an unknown one is an error naming it and the file.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/log.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_load.h"

namespace grpo {

using json = nlohmann::json;
namespace fs = std::filesystem;

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error_status("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<json> read_json_file(const std::string& path) {
  GRPO_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return error_status("malformed JSON in " + path + ": " + e.what());
  }
}

namespace {

Status unsupported(const std::string& what, const std::string& file) {
  return error_status(file + ": unsupported " + what +
                      " (grpo implements byte-level BPE and SentencePiece-style BPE as HF tokenizers runs them); "
                      "refusing to load rather than tokenize differently from HF");
}

Result<std::shared_ptr<Regex>> pattern_of(const json& p, const std::string& file) {
  if (p.contains("Regex")) return Regex::compile(p["Regex"].get<std::string>(), false);
  if (p.contains("String")) return Regex::compile(p["String"].get<std::string>(), true);
  return Status(unsupported("pattern " + p.dump(), file));
}

Status parse_normalizer(const json& n, const std::string& file, std::vector<NormStep>& out) {
  if (n.is_null()) return ok_status();
  std::string type = n.value("type", "");
  NormStep st;
  if (type == "Sequence") {
    for (const json& s : n["normalizers"]) GRPO_TRY(parse_normalizer(s, file, out));
    return ok_status();
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    st.form = type == "NFC" ? NormForm::nfc : type == "NFD" ? NormForm::nfd : type == "NFKC" ? NormForm::nfkc : NormForm::nfkd;
  } else if (type == "Prepend") {
    st.kind = NormStep::prepend;
    st.text = n["prepend"].get<std::string>();
  } else if (type == "Replace") {
    st.kind = NormStep::replace;
    st.text = n["content"].get<std::string>();
    GRPO_ASSIGN_OR_RETURN(st.re, pattern_of(n["pattern"], file));
  } else if (type == "Strip") {
    st.kind = NormStep::strip;
    st.strip_left = n.value("strip_left", true);
    st.strip_right = n.value("strip_right", true);
  } else {
    return unsupported("normalizer type '" + type + "'", file);
  }
  out.push_back(std::move(st));
  return ok_status();
}

Result<SplitBehavior> behavior_of(const std::string& b, const std::string& file) {
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  return Status(unsupported("Split behavior '" + b + "'", file));
}

Status parse_pre_tokenizer(const json& p, const std::string& file, std::vector<PreTokStep>& out) {
  if (p.is_null()) return ok_status();
  std::string type = p.value("type", "");
  PreTokStep st;
  if (type == "Sequence") {
    for (const json& s : p["pretokenizers"]) GRPO_TRY(parse_pre_tokenizer(s, file, out));
    return ok_status();
  }
  if (!out.empty() && out.back().kind == PreTokStep::byte_level)
    return unsupported("pre-tokenizer step '" + type + "' after ByteLevel", file);
  if (type == "Split") {
    GRPO_ASSIGN_OR_RETURN(st.re, pattern_of(p["pattern"], file));
    GRPO_ASSIGN_OR_RETURN(st.behavior, behavior_of(p.value("behavior", "Isolated"), file));
    st.invert = p.value("invert", false);
  } else if (type == "ByteLevel") {
    st.kind = PreTokStep::byte_level;
    st.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      GRPO_ASSIGN_OR_RETURN(st.re, Regex::compile(kGpt2Pattern, false));
    }
  } else if (type == "Metaspace") {
    st.kind = PreTokStep::metaspace;
    st.replacement = p.value("replacement", "\xE2\x96\x81");
    std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
    st.prepend = scheme == "always" ? 2 : scheme == "first" ? 1 : 0;
    st.ms_split = p.value("split", true);
  } else if (type == "Digits") {
    GRPO_ASSIGN_OR_RETURN(st.re, Regex::compile(p.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", false));
  } else {
    return unsupported("pre-tokenizer type '" + type + "'", file);
  }
  out.push_back(std::move(st));
  return ok_status();
}

// Flattens the decoder into per-token byte rules; see TokenizerImpl::id_bytes.
struct DecoderSpec {
  bool byte_level = false, byte_fallback = false;
  std::vector<std::pair<std::string, std::string>> replace;
  int strip_left = 0;
};

Status parse_decoder(const json& d, const std::string& file, DecoderSpec& spec, bool* fused) {
  std::string type = d.is_null() ? "null" : d.value("type", "");
  if (type == "Sequence") {
    for (const json& s : d["decoders"]) GRPO_TRY(parse_decoder(s, file, spec, fused));
    return ok_status();
  }
  if (type == "ByteLevel") {
    spec.byte_level = true;
  } else if (type == "Replace" && d["pattern"].contains("String")) {
    spec.replace.emplace_back(d["pattern"]["String"].get<std::string>(), d["content"].get<std::string>());
  } else if (type == "ByteFallback") {
    spec.byte_fallback = true;
  } else if (type == "Fuse") {
    *fused = true;
  } else if (type == "Strip" && *fused && d.value("stop", 0) == 0 && d.value("content", " ") == " ") {
    spec.strip_left += d.value("start", 0);  // after Fuse it strips the start of the whole text
  } else if (type == "Metaspace") {
    std::string rep = d.value("replacement", "\xE2\x96\x81");
    std::string scheme = d.value("prepend_scheme", d.value("add_prefix_space", true) ? "always" : "never");
    spec.replace.emplace_back(rep, " ");
    if (scheme != "never") spec.strip_left += 1;
  } else {
    return unsupported("decoder '" + (d.is_null() ? std::string("null") : d.dump()) + "'", file);
  }
  return ok_status();
}

Status parse_post_processor(const json& p, const std::string& file, TokenizerImpl& t) {
  if (p.is_null()) return ok_status();
  std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& s : p["processors"]) GRPO_TRY(parse_post_processor(s, file, t));
  } else if (type == "ByteLevel") {
    // offsets only
  } else if (type == "TemplateProcessing") {
    bool after = false;
    for (const json& item : p["single"]) {
      if (item.contains("Sequence")) { after = true; continue; }
      std::string name = item["SpecialToken"]["id"].get<std::string>();
      for (const json& id : p["special_tokens"][name]["ids"]) (after ? t.suffix_ids : t.prefix_ids).push_back(id.get<int>());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    t.prefix_ids.push_back(p["cls"][1].get<int>());
    t.suffix_ids.push_back(p["sep"][1].get<int>());
  } else {
    return unsupported("post_processor type '" + type + "'", file);
  }
  return ok_status();
}

AddedToken added_from_json(const json& a, int id) {
  AddedToken t;
  t.id = id;
  t.content = a["content"].get<std::string>();
  t.special = a.value("special", false);
  t.normalized = a.value("normalized", !t.special);
  t.lstrip = a.value("lstrip", false);
  t.rstrip = a.value("rstrip", false);
  t.single_word = a.value("single_word", false);
  return t;
}

}  // namespace

Status load_tokenizer_json(const std::string& file, TokenizerImpl& t, ModelFiles& mf) {
  GRPO_ASSIGN_OR_RETURN(json j, read_json_file(file));
  try {
    if (!j.is_object() || !j.contains("model")) return error_status(file + ": not a tokenizer.json (no \"model\" object)");
    const json& m = j["model"];
    std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
    if (type != "BPE") return unsupported("model type '" + type + "' (only BPE)", file);
    if (!m.value("dropout", json()).is_null() && m["dropout"].get<double>() != 0.0)
      return unsupported("BPE dropout", file);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty())
        return unsupported(std::string("BPE ") + k, file);
    if (!j.value("truncation", json()).is_null() || !j.value("padding", json()).is_null())
      GRPO_LOG_WARN("%s: truncation/padding settings are ignored (encode() never truncates or pads)", file.c_str());
    mf.vocab.reserve(m["vocab"].size());
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) mf.vocab.emplace_back(it.key(), it.value().get<int>());
    for (const json& mg : m["merges"]) {
      if (mg.is_string()) {
        std::string s = mg.get<std::string>();
        size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) return error_status(file + ": merge \"" + s + "\" is not of the form \"a b\"");
        mf.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        mf.merges.emplace_back(mg.at(0).get<std::string>(), mg.at(1).get<std::string>());
      }
    }
    mf.byte_fallback = m.value("byte_fallback", false);
    mf.ignore_merges = m.value("ignore_merges", false);
    mf.fuse_unk = m.value("fuse_unk", false);
    if (m.contains("unk_token") && !m["unk_token"].is_null()) mf.unk_token = m["unk_token"].get<std::string>();
    for (const json& a : j.value("added_tokens", json::array())) t.added.push_back(added_from_json(a, a["id"].get<int>()));
    GRPO_TRY(parse_normalizer(j.value("normalizer", json()), file, t.normalizer));
    GRPO_TRY(parse_pre_tokenizer(j.value("pre_tokenizer", json()), file, t.pre.steps));
    DecoderSpec dec;
    bool fused = false;
    GRPO_TRY(parse_decoder(j.value("decoder", json()), file, dec, &fused));
    mf.decode_byte_level = dec.byte_level;
    mf.decode_byte_fallback = dec.byte_fallback;
    mf.decode_replace = dec.replace;
    t.decode_strip_left = dec.strip_left;
    GRPO_TRY(parse_post_processor(j.value("post_processor", json()), file, t));
  } catch (const json::exception& e) {
    return error_status(file + ": unexpected tokenizer.json structure: " + e.what());
  }
  return ok_status();
}

}  // namespace grpo
