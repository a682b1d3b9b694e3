// Numeric answers: parsing, normalisation and equivalence for GSM8K-style
// and simple math answers.
//
// Rules (what "equivalent" means):
// - Wrappers are removed: \boxed{..}, \fbox{..}, $..$, \(..\), \[..\], \text{..},
//   \textbf{..}, \mathrm{..}, \mbox{..}; LaTeX spaces \, \! \; and "{,}" go.
// - Currency marks are dropped: $, \$, €, £, ¥, ₹, and a leading "USD"/"EUR".
//   Trailing unit words are dropped ("18 eggs", "18 dollars", "5 km"), as is a
//   leading "x =" and trailing punctuation ("18." -> 18). A trailing part that
//   contains another digit ("5 hours 30 minutes") makes the text NOT a number.
// - Thousands commas must be well formed: "1,000" = 1000, "1,00" is not a number.
// - Percent: "50%", "50\%" and "50 percent" equal 50, not 0.5. This is the GSM8K
//   convention: its gold answers for percentage questions are the bare number.
// - Fractions "3/4", \frac{3}{4}, \dfrac, \tfrac and \frac34 are exact rationals.
//   Mixed numbers ("1 1/2") are not recognised. Powers "2^3", "2^{10}" are
//   evaluated (integer exponents 0..62).
// - Values are exact rationals (int64 numerator/denominator, reduced) whenever
//   they fit; otherwise long double. Two exact values are equal iff their
//   rationals are equal ("18.0" == "18", "0.75" == "3/4"), except that when one
//   side has no terminating decimal expansion (e.g. 1/3) the comparison uses the
//   relative tolerance below, since a written decimal cannot equal it exactly.
//   Inexact values always use the tolerance: |a-b| <= 1e-6 * max(|a|,|b|).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace grpo {

struct Number {
  bool exact = true;  // num/den hold the value exactly
  int64_t num = 0;    // reduced; den > 0
  int64_t den = 1;
  long double approx = 0;  // always set
};

inline constexpr long double kAnswerRelTol = 1e-6L;

// Parses text that should denote one number (after the normalisation rules
// above). Returns nullopt when the text is not exactly one number.
std::optional<Number> answer_to_number(std::string_view text);

// Removes wrappers, currency, LaTeX spacing and trailing punctuation; does not
// parse. Exposed for the string-comparison fallback and for tests.
std::string answer_normalize(std::string_view text);

bool numbers_equal(const Number& a, const Number& b);

// Canonical text: "1234", "-0.5", "1/3" (non-terminating), or %.12Lg if inexact.
std::string number_render(const Number& n);

// The last number in free text ("... so she has 1,200 eggs." -> "1,200");
// covers sign, thousands commas, decimals and a/b. nullopt if there is none.
std::optional<std::string> last_number_in(std::string_view text);

// Content of the last \boxed{...} (or \fbox{...}) with balanced braces;
// nullopt when there is none or its braces never close.
std::optional<std::string> last_boxed_content(std::string_view text);

// General math-answer equivalence: numeric equality when both sides parse as
// numbers, else equality of the normalised strings with all whitespace removed
// and \dfrac/\tfrac written as \frac.
bool math_answers_equivalent(std::string_view a, std::string_view b);

}  // namespace grpo
