// Tokenizer encode/decode (HF pipeline order: added tokens are split out of the raw
// text first, then each remaining segment is normalized, pre-tokenized and run through
// BPE), accessors and the incremental decoder. Loading lives in tokenizer_load.cpp.
#include <algorithm>
#include <cctype>
#include <cstdio>

#include "tokenizer/tokenizer_impl.h"

namespace grpo {

namespace {
bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_word_byte(unsigned char c) { return c >= 0x80 || std::isalnum(c) || c == '_'; }

void apply_normalizer(const std::vector<NormStep>& steps, std::string_view in, std::string& out) {
  out.assign(in);
  std::string tmp;
  thread_local std::vector<std::pair<uint32_t, uint32_t>> m;
  for (const NormStep& st : steps) {
    switch (st.kind) {
      case NormStep::unicode:
        if (unicode_normalize(out, st.form, tmp)) out.swap(tmp);  // invalid UTF-8 stays as is
        break;
      case NormStep::prepend:
        if (!out.empty()) out.insert(0, st.text);
        break;
      case NormStep::replace: {
        m.clear();
        st.re->find_all(out, m);
        if (m.empty()) break;
        tmp.clear();
        uint32_t at = 0;
        for (auto [b, e] : m) { tmp.append(out, at, b - at); tmp += st.text; at = e; }
        tmp.append(out, at, std::string::npos);
        out.swap(tmp);
        break;
      }
      case NormStep::strip: {
        size_t b = 0, e = out.size();
        if (st.strip_left) while (b < e && is_ws(out[b])) ++b;
        if (st.strip_right) while (e > b && is_ws(out[e - 1])) --e;
        out = out.substr(b, e - b);
        break;
      }
    }
  }
}

// Finds added tokens (those whose `normalized` flag equals `normalized`) in s, leftmost
// and longest first; calls on_text(piece, offset) for the text between them and
// on_token(id) for each match. lstrip/rstrip matches swallow adjacent whitespace.
template <class OnText, class OnToken>
void split_added(const TokenizerImpl& t, std::string_view s, bool normalized, OnText&& on_text, OnToken&& on_token) {
  size_t last = 0, i = 0;
  while (i < s.size()) {
    const auto& cands = t.added_by_byte[uint8_t(s[i])];
    const AddedToken* hit = nullptr;
    for (int k : cands) {
      const AddedToken& a = t.added[k];
      if (a.normalized != normalized || s.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word && ((i > 0 && is_word_byte(s[i - 1])) ||
                            (i + a.content.size() < s.size() && is_word_byte(s[i + a.content.size()]))))
        continue;
      hit = &a;
      break;
    }
    if (!hit) { ++i; continue; }
    size_t b = i, e = i + hit->content.size();
    if (hit->lstrip) while (b > last && is_ws(s[b - 1])) --b;
    if (hit->rstrip) while (e < s.size() && is_ws(s[e])) ++e;
    if (b > last) on_text(s.substr(last, b - last), last);
    on_token(hit->id);
    last = i = e;
  }
  if (last < s.size()) on_text(s.substr(last), last);
}
}  // namespace

void TokenizerImpl::finish_added() {
  for (auto& v : added_by_byte) v.clear();
  any_normalized_added = false;
  for (size_t k = 0; k < added.size(); ++k) {
    if (added[k].content.empty()) continue;
    added_by_byte[uint8_t(added[k].content[0])].push_back(int(k));
    any_normalized_added |= added[k].normalized;
  }
  for (auto& v : added_by_byte)
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) { return added[a].content.size() > added[b].content.size(); });
}

void TokenizerImpl::encode(std::string_view text, bool add_special, std::vector<int>& out) const {
  if (add_special) out.insert(out.end(), prefix_ids.begin(), prefix_ids.end());
  thread_local Pieces p, tmp;
  auto bpe_segment = [&](std::string_view seg, bool at_start) {
    pre.run(seg, at_start, p, tmp);
    for (auto [b, e] : p.r) model.encode_word(std::string_view(p.buf).substr(b, e - b), out);
  };
  auto push_id = [&](int id) { out.push_back(id); };
  split_added(*this, text, false, [&](std::string_view seg, size_t off) {
    if (normalizer.empty()) return bpe_segment(seg, off == 0);
    std::string norm;
    apply_normalizer(normalizer, seg, norm);
    if (!any_normalized_added) return bpe_segment(norm, off == 0);
    split_added(*this, norm, true, [&](std::string_view s2, size_t off2) { bpe_segment(s2, off == 0 && off2 == 0); },
                push_id);
  }, push_id);
  if (add_special) out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, out);
  return out;
}

Result<std::vector<int>> Tokenizer::encode_checked(std::string_view text, bool add_special_tokens) const {
  size_t bad = utf8_first_invalid(text);
  if (bad != std::string_view::npos)
    return error_status("tokenizer: input text is not valid UTF-8 (first bad byte 0x" +
                        [&] { char b[3]; std::snprintf(b, 3, "%02X", uint8_t(text[bad])); return std::string(b); }() +
                        " at byte offset " + std::to_string(bad) + ")");
  return encode(text, add_special_tokens);
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  const TokenizerImpl& t = *impl_;
  std::string bytes;
  for (int id : ids) {
    if (id < 0 || id >= int(t.id_bytes.size())) continue;  // HF skips unknown ids too
    if (skip_special && t.special[id]) continue;
    bytes += t.id_bytes[id];
  }
  size_t b = 0;
  while (b < bytes.size() && int(b) < t.decode_strip_left && bytes[b] == ' ') ++b;
  std::string out;
  out.reserve(bytes.size() - b);
  utf8_append_lossy(out, std::string_view(bytes).substr(b), false);
  return out;
}

Result<std::string> Tokenizer::decode_checked(const std::vector<int>& ids, bool skip_special) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size())
      return error_status("tokenizer: token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                          " is out of range (vocab size " + std::to_string(vocab_size()) + ", from " + source() + ")");
  return decode(ids, skip_special);
}

int Tokenizer::vocab_size() const { return int(impl_->id_to_token.size()); }

std::optional<int> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->model.vocab.find(token);
  if (it == impl_->model.vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int id) const {
  return id >= 0 && id < vocab_size() ? impl_->id_to_token[id] : std::string();
}

const std::string& Tokenizer::token_bytes(int id) const {
  static const std::string empty;
  return id >= 0 && id < int(impl_->id_bytes.size()) ? impl_->id_bytes[id] : empty;
}

int Tokenizer::bos_id() const { return impl_->bos_id; }
int Tokenizer::eos_id() const { return impl_->eos_id; }
std::vector<int> Tokenizer::eos_ids() const { return impl_->eos_ids; }
bool Tokenizer::is_special(int id) const { return id >= 0 && id < vocab_size() && impl_->special[id]; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::source() const { return impl_->source; }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special), strip_left_(tok.impl()->decode_strip_left) {}

std::string IncrementalDecoder::push(int id) {
  if (id < 0 || id >= tok_.vocab_size() || (skip_special_ && tok_.is_special(id))) return {};
  std::string_view b = tok_.token_bytes(id);
  while (strip_left_ > 0 && !b.empty() && b.front() == ' ') { b.remove_prefix(1); --strip_left_; }
  if (!b.empty()) strip_left_ = 0;  // only the very start of the text is stripped
  pending_ += b;
  std::string out;
  size_t used = utf8_append_lossy(out, pending_, true);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8_append_lossy(out, pending_, false);
  pending_.clear();
  strip_left_ = tok_.impl()->decode_strip_left;
  return out;
}

}  // namespace grpo
