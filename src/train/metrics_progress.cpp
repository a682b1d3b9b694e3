// Console progress bar / plain progress lines. See metrics_progress.h.
#include "train/metrics_progress.h"

#include <unistd.h>

#include <cmath>

#include "core/timer.h"

namespace grpo {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  int64_t t = static_cast<int64_t>(s + 0.5), h = t / 3600, m = (t / 60) % 60, sec = t % 60;
  char b[32];
  if (h > 0) std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", (long long)h, (long long)m, (long long)sec);
  else std::snprintf(b, sizeof b, "%02lld:%02lld", (long long)m, (long long)sec);
  return b;
}

ProgressBar::ProgressBar(int64_t total, std::FILE* out, const ProgressOptions& opt)
    : total_(total), out_(out), opt_(opt), start_s_(now_seconds()) {
  bar_ = opt.mode == ProgressMode::bar || (opt.mode == ProgressMode::automatic && isatty(fileno(out)));
}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::render(int64_t step, double elapsed, const MetricList& shown) const {
  double eta = step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(total_ - step) : -1;
  std::string width = std::to_string(std::to_string(total_).size());
  char head[128];
  std::string s;
  if (bar_) {
    int fill = total_ > 0 ? static_cast<int>(static_cast<double>(opt_.bar_width) * static_cast<double>(step) / static_cast<double>(total_)) : 0;
    fill = std::max(0, std::min(fill, opt_.bar_width));
    s.assign(1, '[');
    s.append(static_cast<size_t>(fill), '#');
    s.append(static_cast<size_t>(opt_.bar_width - fill), '-');
    s.append("] ");
    std::snprintf(head, sizeof head, ("%" + width + "lld/%lld  %s<%s").c_str(), (long long)step, (long long)total_,
                  format_duration(elapsed).c_str(), format_duration(eta).c_str());
  } else {
    std::snprintf(head, sizeof head, "step %lld/%lld elapsed %s eta %s", (long long)step, (long long)total_,
                  format_duration(elapsed).c_str(), format_duration(eta).c_str());
  }
  s += head;
  for (size_t i = 0; i < shown.size(); ++i) {
    char v[64];
    std::snprintf(v, sizeof v, "%.4g", shown[i].second);
    s.append(i == 0 && bar_ ? "  " : " ");
    s.append(shown[i].first);
    s.append("=");
    s.append(v);
  }
  return s;
}

void ProgressBar::update(int64_t step, const MetricList& shown) {
  double now = now_seconds();
  bool last = step >= total_;
  if (bar_) {
    if (!last && now - last_draw_s_ < opt_.min_redraw_s) return;
    std::string s = render(step, now - start_s_, shown);
    size_t len = s.size();
    if (len < last_len_) s += std::string(last_len_ - len, ' ');  // erase the tail of a longer previous line
    std::fprintf(out_, "\r%s", s.c_str());
    last_len_ = len;
    open_line_ = true;
    if (last) finish();
  } else {
    if (!last && (opt_.plain_every <= 0 || step % opt_.plain_every != 0)) return;
    std::fprintf(out_, "%s\n", render(step, now - start_s_, shown).c_str());
  }
  last_draw_s_ = now;
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (open_line_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    open_line_ = false;
  }
}

}  // namespace grpo
