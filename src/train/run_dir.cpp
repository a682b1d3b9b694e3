// Run-directory lock and resume config comparison (see run_dir.h).
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "model/safetensors.h"

namespace grpo {

namespace fs = std::filesystem;
using nlohmann::json;

Result<RunDirLock> RunDirLock::acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error_status("output directory " + dir + ": cannot create: " + ec.message());
  RunDirLock l;
  l.path_ = (fs::path(dir) / ".lock").string();
  // O_CLOEXEC: a child process (reward subprocess) must not inherit and keep the lock.
  l.fd_ = ::open(l.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (l.fd_ < 0) return error_status(l.path_ + ": cannot open the run lock: " + std::strerror(errno));
  if (::flock(l.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return error_status(l.path_ + ": cannot lock: " + std::strerror(err));
    char buf[64] = {0};
    ssize_t n = ::pread(l.fd_, buf, sizeof buf - 1, 0);
    std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return error_status("output directory " + dir + " is in use by another grpo train (pid " +
                        (pid.empty() ? std::string("unknown") : pid) + ", lock " + l.path_ +
                        "); wait for that run to end, stop it, or choose another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(l.fd_, 0) != 0 || ::pwrite(l.fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
    return error_status(l.path_ + ": cannot write the pid into the run lock: " + std::strerror(errno));
  return l;
}

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

void flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(*it, prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  (*out)[prefix] = j.dump();
}

std::map<std::string, std::string> flat_config(const RunConfig& cfg) {
  json j = run_config_to_json(cfg);
  json rewards = j["reward"];
  j.erase("reward");
  std::map<std::string, std::string> out;
  flatten(j, "", &out);
  std::map<std::string, int> seen;
  for (const auto& r : rewards) {
    // The same function may be configured twice; later copies get "#2", "#3", ...
    std::string name = r.value("name", std::string("?"));
    if (int k = ++seen[name]; k > 1) name += "#" + std::to_string(k);
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != "name") out["reward." + name + "." + it.key()] = it->dump();
  }
  for (const char* k : {"run.output_dir", "log.progress", "log.level"}) out.erase(k);
  return out;
}

}  // namespace

std::vector<std::string> run_config_diff(const RunConfig& old_cfg, const RunConfig& new_cfg) {
  const auto a = flat_config(old_cfg), b = flat_config(new_cfg);
  std::vector<std::string> out;
  auto ia = a.begin(), ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back(ia->first + ": " + ia->second + " -> (absent)");
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back(ib->first + ": (absent) -> " + ib->second);
      ++ib;
    } else {
      if (ia->second != ib->second) out.push_back(ia->first + ": " + ia->second + " -> " + ib->second);
      ++ia;
      ++ib;
    }
  }
  return out;
}

Status run_dir_check_resume_config(const std::string& out_dir, const RunConfig& cfg, bool allow_changes,
                                   std::FILE* console) {
  const std::string path = (fs::path(out_dir) / "config.toml").string();
  if (!fs::exists(path)) return ok_status();
  GRPO_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto old = run_config_parse(text, path);
  if (!old.ok()) {
    if (!allow_changes)
      return error_status("--resume: cannot compare with the run's config: " + old.status().message() +
                          "; pass --resume-with-changes to continue with the new config anyway");
    if (console) std::fprintf(console, "warning: --resume-with-changes: %s is unreadable (%s); replacing it\n",
                              path.c_str(), old.status().message().c_str());
    return ok_status();
  }
  const std::vector<std::string> diff = run_config_diff(old.value(), cfg);
  if (diff.empty()) return ok_status();
  std::string list;
  for (const auto& d : diff) list += "\n  " + d;
  if (!allow_changes)
    return error_status("--resume: the config differs from the one this run was started with (" + path + "):" + list +
                        "\nresume with the original config, or pass --resume-with-changes to continue with the new "
                        "one (config.toml is then replaced)");
  if (console)
    std::fprintf(console, "grpo train: --resume-with-changes: continuing with a changed config (was %s):%s\n",
                 path.c_str(), list.c_str());
  return ok_status();
}

}  // namespace grpo
