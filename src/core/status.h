// Recoverable errors: files, JSON, safetensors, HTTP, user config.
// A Status carries a message that names the thing that is wrong (file, field,
// request) and what the user can do about it. Result<T> is a value or a Status.
// Broken internal invariants use GRPO_CHECK (check.h) instead.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace grpo {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status error(std::string msg) { Status s; s.msg_ = std::move(msg); s.ok_ = false; return s; }
  bool ok() const { return ok_; }
  const std::string& message() const { return msg_; }
  // Prefixes context, e.g. status.with_context("loading model.safetensors").
  Status with_context(const std::string& ctx) const {
    if (ok_) return *this;
    return error(ctx + ": " + msg_);
  }
 private:
  bool ok_ = true;
  std::string msg_;
};

inline Status ok_status() { return Status(); }
inline Status error_status(std::string msg) { return Status::error(std::move(msg)); }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}                       // NOLINT implicit
  Result(Status s) : v_(std::move(s)) {}                  // NOLINT implicit; s must be an error
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const { static const Status okst; return ok() ? okst : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
 private:
  std::variant<T, Status> v_;
};

}  // namespace grpo

// Return early from a function returning Status or Result<T>.
#define GRPO_TRY(expr)                                   \
  do {                                                   \
    ::grpo::Status grpo_try_st_ = (expr);                \
    if (!grpo_try_st_.ok()) return grpo_try_st_;         \
  } while (0)

#define GRPO_CONCAT_INNER(a, b) a##b
#define GRPO_CONCAT(a, b) GRPO_CONCAT_INNER(a, b)
// GRPO_ASSIGN_OR_RETURN(auto x, make_x());
#define GRPO_ASSIGN_OR_RETURN(lhs, rexpr)                              \
  auto GRPO_CONCAT(grpo_res_, __LINE__) = (rexpr);                     \
  if (!GRPO_CONCAT(grpo_res_, __LINE__).ok())                          \
    return GRPO_CONCAT(grpo_res_, __LINE__).status();                  \
  lhs = std::move(GRPO_CONCAT(grpo_res_, __LINE__)).value()
