// The Local communicator and the range split shared by every backend.
#include "dist/communicator.h"

#include "core/check.h"

namespace grpo {

std::vector<int64_t> split_even(int64_t n, int parts) {
  GRPO_CHECK(parts >= 1 && n >= 0);
  std::vector<int64_t> b(size_t(parts) + 1, 0);
  const int64_t q = n / parts, r = n % parts;
  for (int p = 0; p < parts; ++p) b[size_t(p) + 1] = b[size_t(p)] + q + (p < r ? 1 : 0);
  return b;
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  Status all_reduce_sum(Context&, Tensor&) override { return ok_status(); }
  Status all_reduce_host(std::span<double>, HostReduce) override { return ok_status(); }
  Result<std::vector<float>> all_gather_host(std::span<const float> mine) override {
    return std::vector<float>(mine.begin(), mine.end());
  }
  Status all_gather_ranges(Context&, Tensor&, std::span<const int64_t>) override { return ok_status(); }
  Status broadcast(Context&, Tensor&, int) override { return ok_status(); }
  Status barrier() override { return ok_status(); }
};

}  // namespace

std::unique_ptr<Communicator> communicator_local() { return std::make_unique<LocalCommunicator>(); }

}  // namespace grpo
