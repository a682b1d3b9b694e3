// llama.cpp's tokenizer test vectors (independent reference, see the parity/
// PROVENANCE.md files): every string must encode to exactly the listed ids, and
// decode back to itself.
#include "tok_test_util.h"

namespace grpo::test {

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, LlamaCppVectors) {
  const Tokenizer& t = tok(GetParam());
  auto cases = parity_cases(GetParam());
  ASSERT_EQ(cases.size(), 46u);
  int bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto ids = t.encode(cases[i].text);
    if (ids != cases[i].ids) {
      ++bad;
      ADD_FAILURE() << GetParam() << " parity #" << i << " text=\"" << cases[i].text << "\" got " << testing::PrintToString(ids)
                    << " want " << testing::PrintToString(cases[i].ids);
    }
    EXPECT_EQ(t.decode(ids), cases[i].text) << "round trip #" << i;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Parity, ::testing::Values("gpt2", "qwen2", "llama3"));

}  // namespace grpo::test
