// Names of an enum-like config value: one table per value serves parsing,
// error messages ("must be one of ...") and key listings, so they cannot
// disagree. A table may hold aliases (several names for one value); the
// first name of a value is its canonical one.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace grpo {

template <class E>
struct EnumName {
  const char* name;
  E value;
};

template <class E>
std::optional<E> enum_parse(std::span<const EnumName<E>> table, std::string_view s) {
  for (const auto& e : table)
    if (s == e.name) return e.value;
  return std::nullopt;
}

// Canonical name of v ("?" if the table lacks it, which is a programming error).
template <class E>
const char* enum_name(std::span<const EnumName<E>> table, E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

// "auto, on, off" (aliases included, in table order).
template <class E>
std::string enum_allowed(std::span<const EnumName<E>> table) {
  std::string s;
  for (const auto& e : table) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

// Every name of the table (aliases included), for lists kept as strings.
template <class E>
std::vector<std::string> enum_names(std::span<const EnumName<E>> table) {
  std::vector<std::string> v;
  for (const auto& e : table) v.emplace_back(e.name);
  return v;
}

}  // namespace grpo
