// CUDA IPC bridge: channel files, version page, export and attach (see ipc_bridge.h).
#include "dist/ipc_bridge.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace grpo {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "grpo.cpp weights ipc v1";
constexpr size_t kPage = 4096;

#ifdef GRPO_HAVE_CUDA
std::string hex_of(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

bool bytes_of(const std::string& h, void* out, size_t n) {
  if (h.size() != 2 * n) return false;
  auto nib = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nib(h[2 * i]), lo = nib(h[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<uint8_t*>(out)[i] = uint8_t(hi * 16 + lo);
  }
  return true;
}

Result<std::string> current_pci_bus_id() {
  int dev = 0;
  char bus[64] = {};
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(bus, sizeof bus, dev);
  if (e != cudaSuccess) return error_status(std::string("CUDA device query failed: ") + cudaGetErrorString(e));
  return std::string(bus);
}
#endif

}  // namespace

Result<std::unique_ptr<IpcVersionPage>> IpcVersionPage::open(const std::string& path, bool create) {
  const int fd = ::open(path.c_str(), create ? (O_RDWR | O_CREAT | O_TRUNC) : O_RDWR, 0644);
  if (fd < 0) return error_status(path + ": cannot open: " + std::strerror(errno));
  if (create && ::ftruncate(fd, kPage) != 0) {
    ::close(fd);
    return error_status(path + ": cannot size: " + std::strerror(errno));
  }
  void* p = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return error_status(path + ": mmap failed: " + std::strerror(errno) + " (a file shorter than a page?)");
  }
  std::unique_ptr<IpcVersionPage> v(new IpcVersionPage);
  v->fd_ = fd;
  v->p_ = static_cast<int64_t*>(p);
  if (create) v->store(0);
  return v;
}

IpcVersionPage::~IpcVersionPage() {
  if (p_) ::munmap(p_, kPage);
  if (fd_ >= 0) ::close(fd_);
}

void IpcVersionPage::store(int64_t v) { std::atomic_ref<int64_t>(*p_).store(v, std::memory_order_release); }
int64_t IpcVersionPage::load() const { return std::atomic_ref<int64_t>(*p_).load(std::memory_order_acquire); }

Result<std::unique_ptr<IpcExporter>> IpcExporter::create(const std::string& run_dir, const ModelWeights& w,
                                                         const std::string& model_dir, int64_t step) {
#ifndef GRPO_HAVE_CUDA
  (void)run_dir, (void)w, (void)model_dir, (void)step;
  return error_status("server.bridge = \"ipc\": this build has no CUDA backend; CUDA IPC shares GPU memory, so it needs "
                      "a CUDA build with the model on the GPU (on the CPU, follow the run with grpo serve --watch)");
#else
  if (w.device != Device::cuda)
    return error_status("server.bridge = \"ipc\": the weights are on the CPU; CUDA IPC shares GPU memory, so run "
                        "the trainer on cuda (or use grpo serve --watch with checkpoints)");
  if (!w.arena.owner)
    return error_status("server.bridge = \"ipc\": the weight arena is borrowed memory; it has no allocation to export");
  // A handle names a whole cudaMalloc allocation: the arena may be a view inside one.
  void* base = w.arena.owner.get();
  const int64_t offset = static_cast<const char*>(w.arena.data) - static_cast<const char*>(base);
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, base);
  if (e != cudaSuccess)
    return error_status(std::string("server.bridge = \"ipc\": cudaIpcGetMemHandle failed: ") + cudaGetErrorString(e));
  GRPO_ASSIGN_OR_RETURN(std::string bus, current_pci_bus_id());
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  std::unique_ptr<IpcExporter> x(new IpcExporter);
  GRPO_ASSIGN_OR_RETURN(x->page_, IpcVersionPage::open((fs::path(run_dir) / kIpcVersionFile).string(), true));
  x->page_->store(step);
  json j = {{"format", kFormat},
            {"pid", int64_t(::getpid())},
            {"pci_bus_id", bus},
            {"handle", hex_of(&h, sizeof h)},
            {"offset", offset},
            {"nbytes", int64_t(w.arena.nbytes())},
            {"dtype", dtype_name(w.dtype)},
            {"model_dir", model_dir},
            {"config", model_config_to_json(w.config)}};
  x->channel_path_ = (fs::path(run_dir) / kIpcChannelFile).string();
  GRPO_TRY(write_file_atomic(x->channel_path_, j.dump(2) + "\n"));
  return x;
#endif
}

IpcExporter::~IpcExporter() {
  if (!channel_path_.empty()) ::unlink(channel_path_.c_str());
}

Result<std::unique_ptr<IpcAttachment>> IpcAttachment::open(const std::string& run_dir) {
#ifndef GRPO_HAVE_CUDA
  (void)run_dir;
  return error_status("--attach: this build has no CUDA backend; CUDA IPC needs a CUDA build on the trainer's GPU "
                      "(on the CPU, follow the run with --watch " + run_dir + ")");
#else
  const std::string path = (fs::path(run_dir) / kIpcChannelFile).string();
  auto text = read_file(path);
  if (!text.ok())
    return error_status("--attach " + run_dir + ": no " + kIpcChannelFile + "; start grpo train with [server] bridge = "
                        "\"ipc\" and --out " + run_dir + " first (the file appears once its weights are on the GPU)");
  json j = json::parse(text.value(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat)
    return error_status(path + ": not a " + kFormat + " channel file (another grpo.cpp version?)");
  std::unique_ptr<IpcAttachment> a(new IpcAttachment);
  cudaIpcMemHandle_t h;
  int64_t offset = 0, nbytes = 0;
  std::string dt_name, bus;
  try {
    if (!bytes_of(j.at("handle").get<std::string>(), &h, sizeof h)) return error_status(path + ": bad \"handle\"");
    offset = j.at("offset").get<int64_t>();
    nbytes = j.at("nbytes").get<int64_t>();
    dt_name = j.at("dtype").get<std::string>();
    bus = j.at("pci_bus_id").get<std::string>();
    a->pid_ = j.at("pid").get<int>();
    a->model_dir_ = j.at("model_dir").get<std::string>();
  } catch (const json::exception& ex) {
    return error_status(path + ": " + ex.what());
  }
  GRPO_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_from_json(j.at("config")));
  DType dt = dt_name == "bf16" ? DType::bf16 : dt_name == "f32" ? DType::f32 : dt_name == "f16" ? DType::f16 : DType::i32;
  if (dt == DType::i32) return error_status(path + ": unsupported dtype " + dt_name);
  if (nbytes != weights_numel(cfg) * int64_t(dtype_size(dt)))
    return error_status(path + ": " + std::to_string(nbytes) + " bytes do not hold the model of its config");
  if (!a->trainer_alive()) return error_status(path + ": the trainer (pid " + std::to_string(a->pid_) + ") is gone");
  GRPO_ASSIGN_OR_RETURN(std::string mine, current_pci_bus_id());
  if (mine != bus)
    return error_status("--attach: the trainer's weights are on GPU " + bus + ", this process runs on " + mine +
                        "; CUDA IPC serves on the same GPU (set CUDA_VISIBLE_DEVICES to it)");
  cudaError_t e = cudaIpcOpenMemHandle(&a->base_, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess)
    return error_status(std::string("--attach: cudaIpcOpenMemHandle failed: ") + cudaGetErrorString(e) +
                        " (is the trainer still running, on this machine?)");
  GRPO_ASSIGN_OR_RETURN(a->page_, IpcVersionPage::open((fs::path(run_dir) / kIpcVersionFile).string(), false));
  Tensor arena = tensor_borrow(static_cast<char*>(a->base_) + offset, dt, Device::cuda, {weights_numel(cfg)});
  a->w_.dtype = dt;
  a->w_.device = Device::cuda;
  weights_bind(a->w_, cfg, arena);
  return a;
#endif
}

IpcAttachment::~IpcAttachment() {
#ifdef GRPO_HAVE_CUDA
  if (base_) cudaIpcCloseMemHandle(base_);
#endif
}

bool IpcAttachment::trainer_alive() const { return pid_ > 0 && (::kill(pid_, 0) == 0 || errno == EPERM); }

}  // namespace grpo
