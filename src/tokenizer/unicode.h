// UTF-8 helpers for the tokenizer: validation, lossy decoding with U+FFFD,
// the GPT-2 byte<->unicode map of byte-level BPE, and Unicode normalization
// (utf8proc). Lossy decoding replaces each maximal ill-formed subpart with one
// U+FFFD, the rule Rust's String::from_utf8_lossy (and so HF tokenizers) uses.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace grpo {

// Appends the UTF-8 encoding of code point cp.
void utf8_append(std::string& out, uint32_t cp);

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when s[i..] starts
// with an ill-formed or truncated sequence.
size_t utf8_seq_len(std::string_view s, size_t i);

// Byte offset of the first ill-formed byte, or npos when s is valid UTF-8.
size_t utf8_first_invalid(std::string_view s);

// Length of the maximal ill-formed subpart starting at s[i] (>= 1), per Unicode §3.9.
// If `at_end_ok`, returns 0 when s[i..] is a truncated but so far valid prefix of a
// sequence that reaches the end of s (the incremental decoder holds such bytes back).
size_t utf8_bad_len(std::string_view s, size_t i, bool at_end_ok);

// Appends s to out, replacing ill-formed parts with U+FFFD. Returns the number of bytes
// of s consumed: all of s, unless `hold_incomplete` and s ends in a truncated sequence.
size_t utf8_append_lossy(std::string& out, std::string_view s, bool hold_incomplete);

// GPT-2 byte-level alphabet: byte b <-> one printable code point (as UTF-8 text).
const std::string& byte_to_unicode(uint8_t b);
// The byte a byte-level code point stands for, or -1 when cp is not in the alphabet.
int unicode_to_byte(uint32_t cp);

enum class NormForm { none, nfc, nfd, nfkc, nfkd };
// Normalizes valid UTF-8 text; returns false (out untouched) for invalid UTF-8.
bool unicode_normalize(std::string_view s, NormForm form, std::string& out);

}  // namespace grpo
