// Internal to the Jinja subset: the lexer's tokens (see jinja_lex.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/jinja.h"

namespace grpo::jinja {

struct Tok {
  enum Kind { text, var_begin, var_end, block_begin, block_end, name, str, num_int, num_float, op, eof } kind;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

// Template source -> tokens (text, tag delimiters, expression tokens, eof). Throws TemplateError.
std::vector<Tok> lex(std::string src);

}  // namespace grpo::jinja
