// `grpo tokenize` end to end: runs the binary on small inputs and checks the JSON
// lines and error reporting (ids as in the llama.cpp parity vectors / fixture tests).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tok_test_util.h"

namespace grpo::test {

struct RunResult {
  int rc;
  std::string out;
};
static RunResult run_cli(const std::string& args) {
  std::string cmd = std::string(GRPO_BINARY_PATH) + " tokenize " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

TEST(CmdTokenize, TextJsonlChatAndErrors) {
  std::string qwen = "--model " + tok_dir("qwen2");
  auto r = run_cli(qwen + " --text 'Hello world' --tokens");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({9707, 1879}));
  EXPECT_EQ(j["n_tokens"], 2);
  EXPECT_EQ(j["tokens"], nlohmann::json({"Hello", "\xC4\xA0world"}));

  std::string in = ::testing::TempDir() + "/grpo_tok_cli.jsonl";
  std::ofstream(in) << "{\"text\": \"Hello world\", \"id\": \"a\"}\nnot json\n{\"text\": 3}\n";
  r = run_cli(qwen + " --jsonl " + in);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find(in + ":2: not valid JSON"), std::string::npos) << r.out;
  r = run_cli(qwen + " --jsonl " + in + " --on-error skip");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("{\"line\":1,\"id\":\"a\",\"ids\":[9707,1879],\"n_tokens\":2}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("skipping " + in + ":3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 lines tokenized, 2 skipped"), std::string::npos) << r.out;

  // --chat through the Qwen2.5 template: ChatML around the text, generation prompt last.
  r = run_cli(qwen + " --chat --chat-template " + tok_dir("qwen2") + "/chat_template.Qwen2.5-Instruct.jinja --text hi");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto ids = nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>();
  EXPECT_EQ(ids, tok("qwen2").encode("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                                     "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));

  r = run_cli("--model " + tok_dir("llama3") + " --text x");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("preset"), std::string::npos) << r.out;
  r = run_cli("--model " + tok_dir("llama3") + " --preset llama3 --add-special --text 'Hello world'");
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json({128000, 9906, 1917})) << r.out;
}

}  // namespace grpo::test
