// [[reward]] syntax of the remote functions in a run config: arrays and tables
// of strings from TOML and from --set, the resolved TOML reading back to the
// same parameters, type errors naming the entry; and the request item's JSON
// (invalid UTF-8 in a completion does not throw).
#include <gtest/gtest.h>

#include "env/remote_reward.h"
#include "train/run_config.h"

namespace grpo {
namespace {

using json = nlohmann::json;

const char* kToml = R"(
[[reward]]
name = "command"
command = ["python3", "grader.py", "--strict"]
timeout = 5.0

[[reward]]
name = "http"
weight = 0.5
url = "http://127.0.0.1:9000/score"
headers = { "X-Team" = "blue", "X-Run" = "r1" }
on_failure = "zero"
)";

TEST(RemoteRewardConfig, ArraysAndTablesParseAndRoundTrip) {
  auto c = run_config_parse(kToml, "r.toml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->reward.size(), 2u);
  EXPECT_EQ(c->reward[0].params["command"], json({"python3", "grader.py", "--strict"}));
  EXPECT_EQ(c->reward[1].params["headers"], json({{"X-Team", "blue"}, {"X-Run", "r1"}}));
  EXPECT_EQ(c->reward[1].weight, 0.5);
  auto back = run_config_parse(run_config_to_toml(*c), "resolved.toml");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << run_config_to_toml(*c);
  ASSERT_EQ(back->reward.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->reward[i].name, c->reward[i].name);
    EXPECT_EQ(back->reward[i].params, c->reward[i].params) << i;
  }
}

TEST(RemoteRewardConfig, OverridesTakeTomlValues) {
  auto c = run_config_parse(kToml, "r.toml",
                            {R"(reward.command.command=["python3", "other.py"])", R"(reward.http.headers={ A = "1" })",
                             "reward.http.mode=single"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->reward[0].params["command"], json({"python3", "other.py"}));
  EXPECT_EQ(c->reward[1].params["headers"], json({{"A", "1"}}));
  EXPECT_EQ(c->reward[1].params["mode"], "single");
  auto bad = run_config_parse(kToml, "r.toml", {"reward.command.command=python3 x.py"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("is not a TOML array of strings"), std::string::npos) << bad.status().message();
}

TEST(RemoteRewardConfig, TypeErrorsNameTheEntry) {
  auto mixed = run_config_parse("[[reward]]\nname = \"command\"\ncommand = [\"python3\", 3]\n", "m.toml");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find(
                "reward[0].command = [ 'python3', 3 ]: expected a number, boolean, string, array of strings or table of strings"), std::string::npos) << mixed.status().message();
  auto str = run_config_parse("[[reward]]\nname = \"command\"\ncommand = \"python3 x.py\"\n", "s.toml");
  ASSERT_FALSE(str.ok());
  EXPECT_NE(str.status().message().find("command = \"python3 x.py\": expected an array of strings"), std::string::npos)
      << str.status().message();
}

TEST(RemoteRewardConfig, RequestItemShape) {
  Example ex;
  ex.id = "jsonl/3";
  ex.question = "What is 2+2?";
  ex.answer = "4";
  ex.meta = {{"source", "unit"}};
  Telemetry t;
  t.n_tokens = 7;
  t.truncated = true;
  const std::string completion = std::string("ok \xff\xfe bytes");
  json item = reward_request_item({"P: What is 2+2?", completion, &ex, &t});
  const std::string text = reward_json_dump(item);  // must not throw on the invalid bytes
  json back = json::parse(text);
  EXPECT_EQ(back["prompt"], "P: What is 2+2?");
  EXPECT_EQ(back["completion"], "ok \xEF\xBF\xBD\xEF\xBF\xBD bytes");  // each bad byte -> U+FFFD
  EXPECT_EQ(back["answer"], "4");
  EXPECT_EQ(back["metadata"], json({{"id", "jsonl/3"}, {"question", "What is 2+2?"}, {"n_tokens", 7},
                                    {"truncated", true}, {"row", {{"source", "unit"}}}}));
}

TEST(RemoteRewardConfig, UrlParse) {
  struct Case { const char* url; bool https; const char* host; int port; const char* path; };
  for (const Case& c : {Case{"http://grader:8000/score", false, "grader", 8000, "/score"},
                        Case{"http://10.0.0.2", false, "10.0.0.2", 80, "/"},
                        Case{"https://api.example.com/v1/rate?x=1", true, "api.example.com", 443, "/v1/rate?x=1"},
                        Case{"http://[::1]:9000/s", false, "[::1]", 9000, "/s"},
                        Case{"http://[::1]/s", false, "[::1]", 80, "/s"}}) {
    auto u = http_url_parse(c.url);
    ASSERT_TRUE(u.ok()) << c.url << ": " << u.status().message();
    EXPECT_EQ(u->https, c.https) << c.url;
    EXPECT_EQ(u->host, c.host) << c.url;
    EXPECT_EQ(u->port, c.port) << c.url;
    EXPECT_EQ(u->path, c.path) << c.url;
  }
  for (const char* bad : {"grader:8000", "http://", "http://h:/x", "http://h:0/", "http://h:12ab/"})
    EXPECT_FALSE(http_url_parse(bad).ok()) << bad;
}

}  // namespace
}  // namespace grpo
