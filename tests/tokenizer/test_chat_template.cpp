// Chat templates rendered by our Jinja subset must equal jinja2's renders with HF's
// settings (fixture from tools/ref/make_tokenizer_fixtures.py), and their token ids
// must equal HF tokenizers' ids. Unsupported constructs must be reported, not ignored.
#include <nlohmann/json.hpp>

#include "tok_test_util.h"
#include "tokenizer/chat_template.h"

namespace grpo::test {

using ojson = nlohmann::ordered_json;

static std::string template_source(const std::string& ref) {
  size_t hash = ref.find('#');
  if (hash == std::string::npos) return read_file(shared_dir() + "/tokenizers/" + ref);
  auto cfg = nlohmann::json::parse(read_file(shared_dir() + "/tokenizers/" + ref.substr(0, hash)));
  return cfg[ref.substr(hash + 1)].get<std::string>();
}

TEST(ChatTemplate, MatchesJinja2Fixture) {
  std::string path = fixture_dir() + "/chat_templates.json";
  std::string text = read_file(path);
  ASSERT_FALSE(text.empty()) << missing_fixture_msg(path);
  ojson doc = ojson::parse(text);
  ASSERT_EQ(doc["version"].get<int>(), 1);
  int n = 0, with_ids = 0;
  for (const ojson& c : doc["cases"]) {
    std::vector<ChatMessage> msgs;
    for (const ojson& m : c["messages"]) msgs.push_back(ChatMessage::from_json(m).value());
    ChatOptions opt;
    opt.date = doc["date"].get<std::string>();
    opt.add_generation_prompt = c["kwargs"]["add_generation_prompt"].get<bool>();
    if (c["kwargs"].contains("enable_thinking")) opt.enable_thinking = c["kwargs"]["enable_thinking"].get<bool>();
    opt.bos_token = c["special_tokens"].value("bos_token", "");
    opt.eos_token = c["special_tokens"].value("eos_token", "");
    opt.pad_token = c["special_tokens"].value("pad_token", "");
    std::string where = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>() + " / " +
                        c["kwargs"].dump();
    auto r = render_chat(template_source(c["template"].get<std::string>()), msgs, opt);
    ASSERT_TRUE(r.ok()) << where << ": " << r.status().message();
    EXPECT_EQ(r.value(), c["rendered"].get<std::string>()) << where;
    if (c.contains("ids")) {
      EXPECT_EQ(tok(c["tokenizer"].get<std::string>()).encode(r.value()), c["ids"].get<std::vector<int>>()) << where;
      ++with_ids;
    }
    ++n;
  }
  EXPECT_GE(n, 60);
  EXPECT_EQ(with_ids, n) << "chat_templates.json has no token ids: regenerate it with the full script (not --chat-only)";
}

TEST(ChatTemplate, TokenizerExposesTemplate) {
  const Tokenizer& t = tok("qwen2");
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
}

static Status render_status(const std::string& src) {
  ChatOptions opt;
  opt.date = "2026-01-01";
  return render_chat(src, {{"user", "hi"}}, opt).status();
}

TEST(ChatTemplate, UnsupportedConstructsAreErrors) {
  struct Case { const char* src; const char* expect; };
  const Case cases[] = {
      {"a\n{% macro m() %}x{% endmacro %}", "unsupported {% macro %} at line 2"},
      {"{% include 'x.jinja' %}", "unsupported {% include %}"},
      {"{{ messages | wordcount }}", "unsupported filter 'wordcount' at line 1"},
      {"{% if messages is divisibleby 3 %}{% endif %}", "unsupported test 'divisibleby'"},
      {"{{ 'x'.zfill(3) }}", "unsupported method str.zfill()"},
      {"{% for m in messages %}{% break %}{% endfor %}", "unsupported {% break %}"},
      {"{% if true %}open", "missing {% endif %}"},
      {"{{ raise_exception('no system') }}", "raised an exception: no system"},
      {"{{ undefined_thing.attr }}", "'attr' of an undefined value"},
  };
  for (auto& c : cases) {
    Status st = render_status(c.src);
    ASSERT_FALSE(st.ok()) << c.src;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.src << " -> " << st.message();
  }
}

TEST(ChatTemplate, JinjaSemantics) {
  ChatOptions opt;
  opt.date = "2024-07-26";
  opt.extra = {{"xs", {3, 1, 2}}, {"d", {{"b", 1}, {"a", "é\n"}}}};
  auto r = [&](const std::string& src) { auto x = render_chat(src, {{"user", "  Hi  "}}, opt); return x.ok() ? x.value() : x.status().message(); };
  // Values hand-derived from Python/jinja2 semantics.
  EXPECT_EQ(r("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
  EXPECT_EQ(r("{{ xs[::-1] }}|{{ xs[1:] }}|{{ xs[-1] }}|{{ xs|length }}"), "[2, 1, 3]|[1, 2]|2|3");
  EXPECT_EQ(r("{{ d|tojson }}"), "{\"b\": 1, \"a\": \"é\\n\"}");
  EXPECT_EQ(r("{{ d|tojson(indent=2) }}"), "{\n  \"b\": 1,\n  \"a\": \"é\\n\"\n}");
  EXPECT_EQ(r("{{ messages[0].content|trim }}|{{ messages[0]['content'].strip() }}|"), "Hi|Hi|");
  EXPECT_EQ(r("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set y = 5 %}{% endfor %}{{ ns.n }}{{ y }}"), "6");
  EXPECT_EQ(r("{% for x in xs %}{{ loop.index0 }}{{ 'L' if loop.last }}{% endfor %}"), "012L");
  EXPECT_EQ(r("{{ 'a</think>b'.split('</think>')[-1] }}{{ '\\n\\nx\\n'.lstrip('\\n') }}"), "bx\n");
  EXPECT_EQ(r("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 1 / 2 }} {{ none }} {{ true }}"), "3 -4 1 0.5 None True");
  EXPECT_EQ(r("{% if not tools is none %}T{% else %}F{% endif %}{{ tools is none }}"), "FTrue");
  EXPECT_EQ(r("{{ ['a','code','b'] | reject('equalto', 'code') | join(', ') }}"), "a, b");
  EXPECT_EQ(r("  {%- if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(r("{# c #}\n  {% if true %}\nA{% endif %}{{ 'q' }}\n"), "Aq");
}

}  // namespace grpo::test
