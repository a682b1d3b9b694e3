// Console progress for a run: "step i/N, elapsed, ETA, key metrics".
// On a terminal it redraws one line in place with a bar:
//   [########------------]  40/100  00:12<00:18  reward=0.45 loss=0.12
// When the stream is not a terminal (log file, CI) it prints plain lines
// instead, one every `plain_every` steps and always for the last step:
//   step 40/100 elapsed 00:12 eta 00:18 reward=0.45 loss=0.12
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "train/metrics_writer.h"

namespace grpo {

enum class ProgressMode { automatic, bar, plain };

struct ProgressOptions {
  ProgressMode mode = ProgressMode::automatic;  // automatic: bar iff the stream is a TTY
  int bar_width = 20;
  int64_t plain_every = 1;
  double min_redraw_s = 0.1;  // bar mode: redraw at most this often (the last step always draws)
};

class ProgressBar {
 public:
  ProgressBar(int64_t total, std::FILE* out, const ProgressOptions& opt = {});
  // `step` = steps completed so far (1..total); `shown` = metrics for the line.
  void update(int64_t step, const MetricList& shown);
  // Ends the bar line (bar mode). Called by the destructor if needed.
  void finish();
  ~ProgressBar();
  bool is_bar() const { return bar_; }

  // Pure formatting, for tests: the text of one update.
  std::string render(int64_t step, double elapsed_s, const MetricList& shown) const;

 private:
  int64_t total_;
  std::FILE* out_;
  ProgressOptions opt_;
  bool bar_;
  double start_s_, last_draw_s_ = -1e300;
  size_t last_len_ = 0;
  bool open_line_ = false;
};

// "MM:SS" below an hour, "H:MM:SS" above; "--:--" for negative/non-finite.
std::string format_duration(double seconds);

}  // namespace grpo
