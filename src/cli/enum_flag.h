// CLI11 options over enum-like values, parsed through the value's one name
// table: the flag's help lists the names, a bad name is a usage error naming
// the flag, the value and the allowed names. Also the tables of the flags
// several commands share (--device, --dtype of the engine-running commands).
#pragma once
#include <CLI/CLI.hpp>

#include <optional>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/enum_table.h"
#include "core/tensor.h"

namespace grpo::cli {

std::span<const EnumName<Device>> device_flag_names();      // cpu, cuda
std::span<const EnumName<DType>> engine_dtype_flag_names();  // f32, bf16 (what the engines run)

template <class E>
void enum_flag_set(const std::string& flag, std::span<const EnumName<E>> table, const std::string& s, E* out) {
  auto v = enum_parse(table, s);
  if (!v) throw CLI::ValidationError(flag, "'" + s + "' is not one of " + enum_allowed(table));
  *out = *v;
}

// *out keeps its value (the default shown in the help) unless the flag is given.
template <class E>
CLI::Option* add_enum(CLI::App* app, const std::string& flag, E* out, std::span<const EnumName<E>> table,
                      const std::string& help) {
  return app->add_option_function<std::string>(
      flag, [out, table, flag](const std::string& s) { enum_flag_set(flag, table, s, out); },
      help + " (" + enum_allowed(table) + "; default " + enum_name(table, *out) + ")");
}

// As add_enum, for a value whose default depends on other flags (`default_text` says how).
template <class E>
CLI::Option* add_enum(CLI::App* app, const std::string& flag, std::optional<E>* out,
                      std::span<const EnumName<E>> table, const std::string& help, const std::string& default_text) {
  return app->add_option_function<std::string>(
      flag,
      [out, table, flag](const std::string& s) {
        E v{};
        enum_flag_set(flag, table, s, &v);
        *out = v;
      },
      help + " (" + enum_allowed(table) + "; default " + default_text + ")");
}

}  // namespace grpo::cli
