// Tokenizer throughput: encodes War and Peace (3.2 MB) with the gpt2, qwen2 and llama3
// tokenizers, cold (empty BPE cache) and warm, single-threaded, and decodes the ids.
// Prints a table and writes bench/results/tokenizer-<date>.json (DESIGN.md §6; no peer
// runs here: HF tokenizers lives on the GPU machine).
// Usage: bench_tokenizer [shared_data_dir] [results_dir]
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/timer.h"

// CPU time of this thread: the shared build machine is often oversubscribed, and wall
// time then mostly measures other people's compilers.
static double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}
#include "tokenizer/tokenizer.h"

using namespace grpo;

int main(int argc, char** argv) {
  std::string shared = argc > 1 ? argv[1] : "../shared/data";
  std::string results = argc > 2 ? argv[2] : "bench/results";
  std::ifstream f(shared + "/tokenizers/corpus/war-and-peace.txt", std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s/tokenizers/corpus/war-and-peace.txt (pass the shared data dir)\n", shared.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const double mb = double(text.size()) / 1e6;
  nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
  std::printf("%-7s %8s %10s %10s %10s %12s %10s %13s\n", "tok", "load s", "tokens", "cold MB/s", "warm MB/s", "warm tok/s",
              "dec MB/s", "warm MB/s cpu");
  for (const char* name : {"gpt2", "qwen2", "llama3"}) {
    TokenizerOptions opt;
    if (std::string(name) == "llama3") opt.preset = "llama3";
    double t0 = now_seconds();
    auto r = Tokenizer::load(shared + "/tokenizers/" + name, opt);
    double load_s = now_seconds() - t0;
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      return 1;
    }
    const Tokenizer& tok = r.value();
    t0 = now_seconds();
    std::vector<int> ids = tok.encode(text);
    double cold = now_seconds() - t0;
    double warm = 1e30, warm_cpu = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      t0 = now_seconds();
      double c0 = cpu_seconds();
      ids = tok.encode(text);
      warm = std::min(warm, now_seconds() - t0);
      warm_cpu = std::min(warm_cpu, cpu_seconds() - c0);
    }
    t0 = now_seconds();
    std::string back = tok.decode(ids);
    double dec = now_seconds() - t0;
    if (back != text) std::fprintf(stderr, "warning: %s decode(encode(text)) != text\n", name);
    std::printf("%-7s %8.2f %10zu %10.1f %10.1f %12.0f %10.1f %13.1f\n", name, load_s, ids.size(), mb / cold, mb / warm,
                double(ids.size()) / warm, mb / dec, mb / warm_cpu);
    metrics[name] = {{"load_s", load_s},           {"n_tokens", ids.size()},
                     {"encode_cold_mb_s", mb / cold}, {"encode_warm_mb_s", mb / warm},
                     {"encode_warm_tokens_s", double(ids.size()) / warm}, {"decode_mb_s", mb / dec},
                     {"encode_warm_mb_s_cpu_time", mb / warm_cpu},
                     {"encode_warm_tokens_s_cpu_time", double(ids.size()) / warm_cpu},
                     {"round_trip_ok", back == text}};
  }
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  nlohmann::ordered_json doc = {
      {"bench", "tokenizer"},
      {"date", date},
      {"device", "cpu (1 thread)"},
      {"command", std::string(argv[0]) + " " + shared + " " + results},
      {"config", {{"corpus", "war-and-peace.txt"}, {"bytes", text.size()}, {"threads", 1}, {"warm_reps", 3}}},
      {"metrics", metrics},
      {"peer", nullptr},
      {"ratios", nlohmann::ordered_json::object()}};
  std::filesystem::create_directories(results);
  std::string out = results + "/tokenizer-" + date + ".json";
  std::ofstream(out) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
