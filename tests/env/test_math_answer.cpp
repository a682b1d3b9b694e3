// Number parsing, rendering and general math-answer equivalence. Expected
// values are hand-derived (e.g. 3/4 = 0.75, \frac{6}{8} reduces to 3/4).
#include <gtest/gtest.h>

#include "env/math_answer.h"

namespace grpo {
namespace {

void expect_ratio(const char* text, int64_t num, int64_t den) {
  auto v = answer_to_number(text);
  ASSERT_TRUE(v.has_value()) << text;
  EXPECT_TRUE(v->exact) << text;
  EXPECT_EQ(v->num, num) << text;
  EXPECT_EQ(v->den, den) << text;
}

TEST(MathAnswer, ParsesExactRationals) {
  expect_ratio("1,234", 1234, 1);
  expect_ratio("-1,234,567", -1234567, 1);
  expect_ratio("18.0", 18, 1);
  expect_ratio("0.75", 3, 4);
  expect_ratio("3/4", 3, 4);
  expect_ratio("6 / 8", 3, 4);
  expect_ratio("\\frac{6}{8}", 3, 4);
  expect_ratio("\\dfrac{-1}{2}", -1, 2);
  expect_ratio("-\\tfrac{1}{3}", -1, 3);
  expect_ratio("\\frac34", 3, 4);
  expect_ratio("2^10", 1024, 1);
  expect_ratio("2^{3}", 8, 1);
  expect_ratio("$18", 18, 1);
  expect_ratio("\\$ 18.25", 73, 4);
  expect_ratio("18 eggs", 18, 1);
  expect_ratio("50%", 50, 1);
  expect_ratio("50 percent", 50, 1);
  expect_ratio(".5", 1, 2);
  expect_ratio("\\boxed{\\dfrac{1}{2}}", 1, 2);
  expect_ratio("$\\frac{1}{2}$", 1, 2);
  expect_ratio("\\boxed{18}.", 18, 1);
  expect_ratio("$18$.", 18, 1);
  expect_ratio("\\(12\\)", 12, 1);
  expect_ratio("1\\,000", 1000, 1);
  expect_ratio("k = 7", 7, 1);
  expect_ratio("007", 7, 1);
}

TEST(MathAnswer, RejectsNonNumbers) {
  for (const char* t : {"", "abc", "1,00", "1,2,3x4", "5 hours 30 minutes", "1/0", "\\frac{1}{0}", "--5",
                        "\\frac{1}", "2^x", "1e5"}) {
    EXPECT_FALSE(answer_to_number(t).has_value()) << t;
  }
}

TEST(MathAnswer, BigValuesFallBackToLongDouble) {
  auto v = answer_to_number("123456789012345678901234");
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->exact);
  EXPECT_TRUE(numbers_equal(*v, *answer_to_number("123456789012345678901234.0")));
  EXPECT_FALSE(numbers_equal(*v, *answer_to_number("123456789012345678")));
  auto p = answer_to_number("10^30");
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->exact);
}

TEST(MathAnswer, Render) {
  EXPECT_EQ(number_render(*answer_to_number("3/4")), "0.75");
  EXPECT_EQ(number_render(*answer_to_number("1/3")), "1/3");
  EXPECT_EQ(number_render(*answer_to_number("-0.5")), "-0.5");
  EXPECT_EQ(number_render(*answer_to_number("-1/8")), "-0.125");
  EXPECT_EQ(number_render(*answer_to_number("0.05")), "0.05");
  EXPECT_EQ(number_render(*answer_to_number("1,200")), "1200");
  EXPECT_EQ(number_render(*answer_to_number("-0")), "0");
}

TEST(MathAnswer, Equivalence) {
  EXPECT_TRUE(math_answers_equivalent("\\frac{1}{2}", "0.5"));
  EXPECT_TRUE(math_answers_equivalent("1/2", "\\boxed{\\dfrac{1}{2}}"));
  EXPECT_TRUE(math_answers_equivalent("2^3", "8"));
  EXPECT_TRUE(math_answers_equivalent("0.3333333", "1/3"));
  EXPECT_FALSE(math_answers_equivalent("0.33", "1/3"));
  EXPECT_FALSE(math_answers_equivalent("0.5", "0.50001"));
  EXPECT_TRUE(math_answers_equivalent("x + 1", "x+1"));  // string fallback, whitespace-insensitive
  EXPECT_TRUE(math_answers_equivalent("\\dfrac{a}{b}", "\\frac{a}{b}"));
  EXPECT_FALSE(math_answers_equivalent("x+1", "x+2"));
  EXPECT_FALSE(math_answers_equivalent("", ""));
  EXPECT_TRUE(math_answers_equivalent("\\text{(A)}", "(A)"));
}

TEST(MathAnswer, LastNumberAndBoxed) {
  EXPECT_EQ(*last_number_in("a 1, b 2,000 and 3.5."), "3.5");
  EXPECT_EQ(*last_number_in("ratio 3/4"), "3/4");
  EXPECT_EQ(*last_number_in("x -7"), "-7");
  EXPECT_EQ(*last_number_in("10-3"), "3");
  EXPECT_EQ(*last_number_in("H2O and 5"), "5");
  EXPECT_FALSE(last_number_in("none").has_value());
  EXPECT_EQ(*last_boxed_content("\\boxed{a{b}c} \\boxed{d}"), "d");
  EXPECT_EQ(*last_boxed_content("\\boxed{a{b}c}"), "a{b}c");
  EXPECT_EQ(*last_boxed_content("\\fbox{9}"), "9");
  EXPECT_FALSE(last_boxed_content("\\boxed{unclosed").has_value());
}

}  // namespace
}  // namespace grpo
