// JSONL reading (bad lines reported with file:line, fail or skip-with-count),
// dataset field mapping, prompt templates and the JSONL round trip.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "env/dataset.h"

namespace grpo {
namespace {

std::string tmp_path(const char* name) { return testing::TempDir() + name; }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(Jsonl, FailsOnFirstBadLineNamingFileAndLine) {
  std::string p = tmp_path("bad.jsonl");
  write_text(p, "{\"a\":1}\n\n{\"a\":2,}\n{\"a\":3}\n");
  auto r = jsonl_read(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(p + ":3: "), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("parse error"), std::string::npos) << r.status().message();
}

TEST(Jsonl, SkipsAndCountsBadLines) {
  std::string p = tmp_path("skip.jsonl");
  write_text(p, "{\"a\":1}\n  \nnot json\n[1,2]\n{\"a\":3}");  // no trailing newline on the last line
  JsonlOptions o;
  o.on_bad_line = BadLinePolicy::skip;
  auto r = jsonl_read(p, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rows.size(), 2u);
  EXPECT_EQ(r->report.n_lines, 5u);
  EXPECT_EQ(r->report.n_blank, 1u);
  EXPECT_EQ(r->report.n_bad, 2u);  // "not json" and the array (objects required)
  ASSERT_EQ(r->report.errors.size(), 2u);
  EXPECT_EQ(r->report.errors[0].rfind(p + ":3: ", 0), 0u);
  EXPECT_NE(r->report.errors[1].find(":4: expected a JSON object, got array"), std::string::npos);
  EXPECT_EQ(r->line_of_row[1], 5u);
  EXPECT_NE(jsonl_report_summary("x", r->report).find("2 bad line(s) skipped"), std::string::npos);
}

TEST(Jsonl, MissingFile) {
  auto r = jsonl_read("/nonexistent/x.jsonl");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/x.jsonl"), std::string::npos);
}

// A directory opens as a stream that reads nothing; it must not pass for an empty file.
TEST(Jsonl, DirectoryIsAnError) {
  auto r = jsonl_read(testing::TempDir());
  ASSERT_FALSE(r.ok()) << "a directory read as an empty JSONL file";
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(testing::TempDir()), std::string::npos) << r.status().message();
}

TEST(Jsonl, RoundTrip) {
  std::vector<nlohmann::json> rows = {{{"q", "a \"quoted\"\nline"}, {"n", 1}},
                                      {{"q", "\xC3\xA9t\xC3\xA9"}, {"n", -2.5}, {"nested", {{"k", true}}}}};
  std::string p = tmp_path("rt.jsonl");
  ASSERT_TRUE(jsonl_write(p, rows).ok());
  auto r = jsonl_read(p);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->rows.size(), 2u);
  EXPECT_EQ(r->rows[0], rows[0]);
  EXPECT_EQ(r->rows[1], rows[1]);
}

TEST(Dataset, FieldMapping) {
  std::string p = tmp_path("ds.jsonl");
  write_text(p,
             "{\"problem\":{\"text\":\"2+2?\"},\"sol\":4,\"src\":\"x\"}\n"
             "{\"problem\":{\"text\":\"3+3?\"},\"sol\":\"6\"}\n"
             "{\"problem\":{\"text\":\"4+4?\"}}\n");
  FieldMap m;
  m.prompt_field = "problem.text";
  m.answer_field = "sol";
  auto bad = dataset_load_jsonl(p, "toy", m);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(p + ":3: missing field 'sol'"), std::string::npos) << bad.status().message();
  JsonlOptions o;
  o.on_bad_line = BadLinePolicy::skip;
  auto ds = dataset_load_jsonl(p, "toy", m, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  ASSERT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->report.n_bad, 1u);
  EXPECT_EQ(ds->examples[0].question, "2+2?");
  EXPECT_EQ(ds->examples[0].answer, "4");
  EXPECT_EQ(ds->examples[0].id, "toy/0");
  EXPECT_EQ(ds->examples[0].meta["src"], "x");
  EXPECT_EQ(ds->examples[1].answer, "6");
}

TEST(Dataset, GsmStyleSolutionField) {
  std::string p = tmp_path("gs.jsonl");
  write_text(p, "{\"question\":\"q\",\"answer\":\"work <<1+1=2>>\\n#### 1,002\"}\n");
  FieldMap m;
  m.answer_is_solution = true;
  auto ds = dataset_load_jsonl(p, "g", m);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->examples[0].answer, "1002");
  EXPECT_EQ(ds->examples[0].solution, "work <<1+1=2>>\n#### 1,002");
}

TEST(Prompt, Render) {
  Example ex;
  ex.question = "What is 2+2?";
  ex.id = "t/1";
  EXPECT_EQ(prompt_render("Q: {question}\nA:", ex).value(), "Q: What is 2+2?\nA:");
  EXPECT_EQ(prompt_render("{{literal}} {id}", ex).value(), "{literal} t/1");
  auto bad = prompt_render("{questoin}", ex);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("{questoin}"), std::string::npos);
  EXPECT_FALSE(prompt_render("{question", ex).ok());
}

TEST(Dataset, OrderIsASeededPermutation) {
  auto a = dataset_order(100, 7), b = dataset_order(100, 7), c = dataset_order(100, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<bool> seen(100);
  for (size_t i : a) seen[i] = true;
  for (bool s : seen) EXPECT_TRUE(s);
}

TEST(Splitmix, KnownVector) {
  // splitmix64 with state 0: first output 0xE220A8397B1DCDAF (Vigna's reference sequence).
  uint64_t st = 0;
  EXPECT_EQ(splitmix64_next(&st), 0xE220A8397B1DCDAFull);
}

}  // namespace
}  // namespace grpo
