// Tokenizer: BPE as Hugging Face `tokenizers` runs it, loaded from a tokenizer.json or
// a model directory. Two families are supported:
//   - byte-level BPE (GPT-2, Qwen2/2.5/3, Llama-3): normalizer (NFC), Split regex +
//     ByteLevel pre-tokenizers, merges, `ignore_merges`;
//   - SentencePiece-style BPE as HF writes it (Llama-2, Mistral): Prepend/Replace or
//     Metaspace, `byte_fallback` (<0xNN> tokens), Replace/ByteFallback/Fuse/Strip decoder.
// Anything else in a tokenizer.json (WordPiece, Unigram, an unknown pre-tokenizer...)
// makes load() fail with a message naming the feature and the file: a tokenizer that
// silently tokenizes differently from HF would poison training data.
//
// Encoding matches HF with split_special_tokens=False: added tokens found in the text
// (leftmost, longest) are emitted as their ids. Objects are immutable after load() and
// safe to share between threads (the BPE cache is internally locked); copies are cheap.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace grpo {

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = true;      // skipped by decode(skip_special=true)
  bool normalized = false;  // matched in normalized text instead of the raw text
  bool lstrip = false, rstrip = false;  // the match swallows whitespace on that side
  bool single_word = false;             // only matches when not inside a word
};

// For the vocab/merges form (vocab.json + merges.txt, or GPT-2's encoder.json +
// vocab.bpe), which does not say how to pre-tokenize. Nothing is guessed: without a
// preset, loading that form fails. preset_options() fills one for a known family.
struct TokenizerOptions {
  std::string preset;                 // "gpt2" | "qwen2" | "llama3": regex, NFC, ignore_merges
  std::optional<std::string> pattern; // overrides the preset's pre-tokenizer regex
  std::optional<bool> ignore_merges;  // overrides the preset's
  std::optional<bool> nfc;            // overrides the preset's NFC normalizer
  std::vector<AddedToken> added_tokens;  // added to (or overriding) those found in the folder
  std::string bos_token, eos_token;   // names; empty = take from tokenizer_config.json if any
  std::optional<bool> add_bos;        // prepend bos when encode(add_special_tokens=true)
  std::vector<std::string> extra_eos_tokens;  // also end generation (e.g. Llama-3 <|eom_id|>)
};
// Options for a known family, special tokens included (llama3: 128000..128255 named as
// in Llama-3.1, bos <|begin_of_text|>, eos <|eot_id|> plus <|end_of_text|>, <|eom_id|>).
Result<TokenizerOptions> preset_options(const std::string& name);

struct TokenizerImpl;

class Tokenizer {
 public:
  // path: a tokenizer.json file, or a directory holding tokenizer.json (preferred), or
  // vocab.json + merges.txt, or encoder.json + vocab.bpe. tokenizer_config.json,
  // chat_template.jinja and generation_config.json next to it are read when present.
  static Result<Tokenizer> load(const std::string& path, const TokenizerOptions& opt = {});

  // Text to ids. Invalid UTF-8 is tokenized byte by byte (byte-level models) or through
  // byte fallback; encode_checked() rejects it instead, naming the byte offset.
  std::vector<int> encode(std::string_view text, bool add_special_tokens = false) const;
  Result<std::vector<int>> encode_checked(std::string_view text, bool add_special_tokens = false) const;
  // Ids to text; ill-formed UTF-8 becomes U+FFFD. Ids outside the vocabulary are
  // skipped as HF does; decode_checked() reports them instead.
  std::string decode(const std::vector<int>& ids, bool skip_special = false) const;
  Result<std::string> decode_checked(const std::vector<int>& ids, bool skip_special = false) const;

  int vocab_size() const;  // 1 + the largest id (vocabulary and added tokens)
  std::optional<int> token_to_id(std::string_view token) const;
  std::string id_to_token(int id) const;  // "" when out of range
  int bos_id() const;                     // -1 if none
  int eos_id() const;                     // -1 if none
  std::vector<int> eos_ids() const;       // eos and other ids that end generation
  bool is_special(int id) const;
  bool add_bos() const;
  const std::vector<AddedToken>& added_tokens() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  // The chat template from tokenizer_config.json / chat_template.jinja ("" if none).
  const std::string& chat_template() const;
  const std::string& source() const;  // the file it was loaded from

  // Raw bytes a token contributes to decoded text (no U+FFFD repair); used by the
  // incremental decoder. Empty for out-of-range ids.
  const std::string& token_bytes(int id) const;

  std::shared_ptr<const TokenizerImpl> impl() const { return impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;
};

// Streaming detokenizer for generation: push() returns the text that is complete so far,
// holding back a truncated multi-byte sequence until its remaining bytes arrive. The
// concatenation of all push() results and flush() equals tokenizer.decode(all ids).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int id);
  std::string flush();  // emits held bytes (as U+FFFD if still incomplete) and resets

 private:
  Tokenizer tok_;
  bool skip_special_;
  int strip_left_;      // leading spaces still to strip (SentencePiece-style decoders)
  std::string pending_;
};

}  // namespace grpo
