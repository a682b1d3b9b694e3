// JSONL metric round trip, history, plot page and progress output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "train/metrics_jsonl.h"
#include "train/metrics_progress.h"
#include "train/plot.h"

namespace grpo {
namespace {

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(MetricsJsonl, RoundTripAndFlushPerLine) {
  std::string p = testing::TempDir() + "metrics.jsonl";
  {
    auto w = JsonlMetricWriter::open(p);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->write(1, 10.0, {{"reward/mean", 0.5}, {"loss", 0.125}}).ok());
    // Flushed: visible before the writer closes.
    EXPECT_EQ(read_all(p), "{\"step\":1,\"time\":10.0,\"reward/mean\":0.5,\"loss\":0.125}\n");
    ASSERT_TRUE((*w)->write(2, 11.0, {{"reward/mean", 0.75}, {"kl", NAN}}).ok());
  }
  auto h = metrics_jsonl_load(p);
  ASSERT_TRUE(h.ok()) << h.status().message();
  const auto& s = h->series();
  ASSERT_EQ(s.at("reward/mean").size(), 2u);
  EXPECT_EQ(s.at("reward/mean")[1].step, 2);
  EXPECT_EQ(s.at("reward/mean")[1].value, 0.75);
  EXPECT_EQ(s.at("loss").size(), 1u);
  EXPECT_EQ(s.count("kl"), 0u);  // NaN was written as null and is skipped
  EXPECT_EQ(s.count("time"), 0u);
  // Append mode keeps old lines.
  {
    auto w = JsonlMetricWriter::open(p, /*append=*/true);
    ASSERT_TRUE((*w)->write(3, 12.0, {{"loss", 1}}).ok());
  }
  EXPECT_EQ(metrics_jsonl_load(p)->series().at("loss").size(), 2u);
}

TEST(MetricsJsonl, LoadErrorsNameTheLine) {
  std::string p = testing::TempDir() + "bad_metrics.jsonl";
  std::ofstream(p) << "{\"step\":1,\"a\":1}\n{\"a\":2}\n";
  auto h = metrics_jsonl_load(p);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find(p + ":2: "), std::string::npos) << h.status().message();
}

TEST(Metrics, MultiWriterFansOut) {
  MultiMetricWriter m;
  auto a = std::make_unique<MetricHistory>();
  auto b = std::make_unique<MetricHistory>();
  MetricHistory* pa = a.get();
  MetricHistory* pb = b.get();
  m.add(std::move(a));
  m.add(std::move(b));
  ASSERT_TRUE(m.write(5, 0, {{"x", 1}}).ok());
  EXPECT_EQ(pa->series().at("x")[0].step, 5);
  EXPECT_EQ(pb->series().at("x")[0].value, 1);
}

TEST(Plot, SelfContainedHtml) {
  MetricHistory h;
  for (int s = 1; s <= 50; ++s) {
    h.add("reward/mean", s, 0.01 * s);
    h.add("loss", s, s == 25 ? NAN : 1.0 / s);
  }
  h.add("eval/accuracy", 10, 0.5);
  PlotOptions o;
  o.title = "demo <run>";
  o.metrics = {"reward/mean", "loss", "eval/accuracy", "kl"};
  std::string html = plot_render_html(h, o);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("demo &lt;run&gt;"), std::string::npos);  // escaped
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // only the SVG namespace
  EXPECT_EQ(html.find("<link"), std::string::npos);
  auto count = [&](const std::string& t) {
    size_t n = 0;
    for (size_t p = html.find(t); p != std::string::npos; p = html.find(t, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<svg"), 4u);
  EXPECT_EQ(count("<polyline"), 3u);  // reward, loss split in two by the NaN; accuracy is a single point
  EXPECT_EQ(count("<circle"), 1u);
  EXPECT_NE(html.find("no data"), std::string::npos);  // "kl" is absent
  std::string p = testing::TempDir() + "plot.html";
  ASSERT_TRUE(plot_write_html(p, h, {}).ok());
  std::string def = read_all(p);
  EXPECT_NE(def.find("reward/mean"), std::string::npos);  // defaults pick the present metrics
  EXPECT_EQ(def.find("kl<"), std::string::npos);
}

TEST(Progress, DurationFormat) {
  EXPECT_EQ(format_duration(0), "00:00");
  EXPECT_EQ(format_duration(75.4), "01:15");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "--:--");
}

TEST(Progress, PlainLinesWhenNotATty) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressOptions o;
    o.plain_every = 2;
    ProgressBar bar(5, f, o);  // a temp file is not a TTY: plain mode
    EXPECT_FALSE(bar.is_bar());
    for (int s = 1; s <= 5; ++s) bar.update(s, {{"reward", 0.5}});
  }
  std::rewind(f);
  char buf[1024] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string out(buf, n);
  // Steps 2, 4 and the last (5).
  EXPECT_NE(out.find("step 2/5 elapsed "), std::string::npos) << out;
  EXPECT_NE(out.find("step 4/5 "), std::string::npos);
  EXPECT_NE(out.find("step 5/5 "), std::string::npos);
  EXPECT_EQ(out.find("step 3/5"), std::string::npos);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_NE(out.find("reward=0.5\n"), std::string::npos);
}

TEST(Progress, BarRendering) {
  ProgressOptions o;
  o.mode = ProgressMode::bar;
  o.bar_width = 10;
  std::FILE* f = std::tmpfile();
  ProgressBar bar(100, f, o);
  // 40/100 after 12 s: 4 of 10 cells, ETA = 12/40*60 = 18 s.
  EXPECT_EQ(bar.render(40, 12.0, {{"reward", 0.45}, {"loss", 0.12}}),
            "[####------]  40/100  00:12<00:18  reward=0.45 loss=0.12");
  bar.update(100, {});
  bar.finish();
  std::fclose(f);
}

}  // namespace
}  // namespace grpo
