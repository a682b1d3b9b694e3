// Connection handling of ConnServer (see http_conn.h): the keep-alive loop, a
// buffered socket stream, GET bodies, client-gone probes and the graceful close.
#include "server/http_conn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

namespace grpo {

namespace {

using Clock = std::chrono::steady_clock;

// poll() on one descriptor; >0 ready (see *revents), 0 timed out, <0 failed.
int poll_fd(int fd, short events, int timeout_ms, short* revents = nullptr) {
  pollfd p{fd, events, 0};
  int r;
  do r = ::poll(&p, 1, timeout_ms);
  while (r < 0 && errno == EINTR);
  if (revents) *revents = p.revents;
  return r;
}

int to_ms(time_t sec, time_t usec) {
  return int(std::min<int64_t>(INT_MAX, int64_t(sec) * 1000 + int64_t(usec) / 1000));
}

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &s->sin_addr, buf, sizeof(buf));
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof(buf));
    port = ntohs(s->sin6_port);
  }
  ip = buf;
}

// A socket stream with a read buffer: httplib reads request lines a byte at a time,
// and bytes of a pipelined next request stay here between requests.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(int fd, int read_ms, int write_ms) : fd_(fd), read_ms_(read_ms), write_ms_(write_ms) {}

  bool is_readable() const override { return pos_ < len_ || poll_fd(fd_, POLLIN, read_ms_) > 0; }
  bool is_writable() const override { return poll_fd(fd_, POLLOUT, write_ms_) > 0; }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (pos_ == len_) {
      if (poll_fd(fd_, POLLIN, read_ms_) <= 0) return -1;  // timed out or failed
      if (size >= sizeof(buf_)) {
        const ssize_t n = recv_into(ptr, size);
        if (n > 0) consumed_ += size_t(n);
        return n;
      }
      const ssize_t n = recv_into(buf_, sizeof(buf_));
      if (n <= 0) return n;
      pos_ = 0;
      len_ = size_t(n);
    }
    const size_t k = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_ + pos_, k);
    pos_ += k;
    consumed_ += k;
    return ssize_t(k);
  }

  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override {
    if (poll_fd(fd_, POLLOUT, write_ms_) <= 0) return -1;
    ssize_t n;
    do n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t n = sizeof(a);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &n) == 0) address_of(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t n = sizeof(a);
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n) == 0) address_of(a, ip, port);
  }
  socket_t socket() const override { return fd_; }

  bool has_buffered() const { return pos_ < len_; }
  size_t consumed() const { return consumed_; }  // bytes handed to the reader so far
  bool peer_closed() const { return peer_closed_; }

 private:
  ssize_t recv_into(char* p, size_t n) {
    ssize_t r;
    do r = ::recv(fd_, p, n, 0);
    while (r < 0 && errno == EINTR);
    if (r == 0) peer_closed_ = true;
    return r < 0 ? -1 : r;
  }

  int fd_;
  int read_ms_, write_ms_;
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
  size_t consumed_ = 0;
  bool peer_closed_ = false;
};

struct ConnState {
  ConnStream* strm = nullptr;
  bool has_body_error = false;
  HttpBodyError body_error;
};

// The connection this worker thread is serving (ConnServer runs one per thread at a time).
thread_local ConnState* t_conn = nullptr;

// Inflates a gzip member into *out, stopping past max_out bytes. "" on success, else why not.
std::string gunzip(const std::string& in, size_t max_out, std::string* out) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return "zlib could not start";
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  out->clear();
  char buf[16384];
  int r = Z_OK;
  while (r == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    r = inflate(&z, Z_NO_FLUSH);
    if (r != Z_OK && r != Z_STREAM_END) break;
    out->append(buf, sizeof(buf) - z.avail_out);
    if (out->size() > max_out) {
      inflateEnd(&z);
      return "the inflated body is larger than the server's limit of " + std::to_string(max_out) + " bytes";
    }
    if (r == Z_OK && z.avail_in == 0 && z.avail_out != 0) break;  // truncated input
  }
  inflateEnd(&z);
  return r == Z_STREAM_END ? std::string() : std::string("the body is not valid gzip");
}

// Reads the body httplib would leave unread (methods it reads no body for), so that the
// handler sees it and the next request on the connection starts where it should.
void read_skipped_body(ConnStream& strm, httplib::Request& req, size_t max_bytes, ConnState& st,
                       bool& connection_closed) {
  st.has_body_error = false;
  const std::string& m = req.method;
  if (m == "POST" || m == "PUT" || m == "PATCH" || m == "DELETE" || m == "PRI") return;  // httplib's own
  auto fail = [&](int status, const std::string& msg, bool close) {
    st.has_body_error = true;
    st.body_error = HttpBodyError{status, msg};
    if (!close) return;
    // The rest of the body is still on the wire: it must not be parsed as a request.
    connection_closed = true;
    req.headers.erase("Connection");
    req.set_header("Connection", "close");
  };
  if (req.has_header("Transfer-Encoding"))
    return fail(411, "a " + m + " request with a body must send it with a Content-Length header, not Transfer-Encoding",
                true);
  if (!req.has_header("Content-Length")) return;
  const std::string v = req.get_header_value("Content-Length");
  size_t n = 0;
  bool ok = !v.empty() && v.size() <= 18 && req.get_header_value_count("Content-Length") == 1;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  if (!ok) return fail(400, "the Content-Length header '" + v + "' is not one non-negative integer", true);
  n = size_t(std::stoull(v));
  if (n == 0) return;
  if (n > max_bytes)
    return fail(413, "the " + m + " body of " + v + " bytes is larger than the server's limit of " +
                         std::to_string(max_bytes) + " bytes",
                true);
  if (req.get_header_value("Expect") == "100-continue") {
    strm.write("HTTP/1.1 100 Continue\r\n\r\n");
    req.headers.erase("Expect");  // answered here; httplib must not answer it again
  }
  std::string body(n, '\0');
  for (size_t got = 0; got < n;) {
    const ssize_t r = strm.read(&body[got], n - got);
    if (r <= 0)
      return fail(400, "the " + m + " body ended (or stalled past the read timeout) before its Content-Length of " + v +
                           " bytes",
                  true);
    got += size_t(r);
  }
  const std::string enc = req.get_header_value("Content-Encoding");
  if (enc == "gzip") {
    std::string plain;
    const std::string why = gunzip(body, max_bytes, &plain);
    if (!why.empty()) return fail(400, "Content-Encoding gzip: " + why, false);
    body.swap(plain);
  } else if (!enc.empty() && enc != "identity") {
    return fail(415, "Content-Encoding '" + enc + "' is not supported (send gzip or none)", false);
  }
  req.body = std::move(body);
}

// Ends a connection. With `drain`, unread bytes may still arrive: FIN first, then read
// and discard them for a short while, so that close() does not answer them with a
// reset that would destroy the response the client has not read yet.
void close_connection(int fd, bool drain) {
  if (drain) {
    ::shutdown(fd, SHUT_WR);
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    char buf[4096];
    size_t total = 0;
    while (Clock::now() < deadline && total < (size_t(16) << 20)) {
      if (poll_fd(fd, POLLIN, 200) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      total += size_t(n);
    }
  }
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

}  // namespace

bool ConnServer::process_and_close_socket(socket_t sock) {
  ConnStream strm(sock, to_ms(read_timeout_sec_, read_timeout_usec_), to_ms(write_timeout_sec_, write_timeout_usec_));
  ConnState st;
  st.strm = &strm;
  t_conn = &st;
  const int keep_alive_ms = to_ms(keep_alive_timeout_sec_, 0);
  // Waits for the next request's first byte; false when idle past the keep-alive
  // timeout or when the server stops (checked every 50 ms).
  auto next_request = [&] {
    if (strm.has_buffered()) return true;
    const auto deadline = Clock::now() + std::chrono::milliseconds(keep_alive_ms);
    while (svr_sock_ != INVALID_SOCKET) {
      const int r = poll_fd(sock, POLLIN, 50);
      if (r != 0) return r > 0;
      if (Clock::now() >= deadline) return false;
    }
    return false;
  };
  bool ret = false;
  bool ended_by_request = false;
  for (size_t left = keep_alive_max_count_; left > 0 && next_request(); --left) {
    bool connection_closed = false;
    bool parsed = false;        // request line and headers were valid (httplib then calls setup_request)
    size_t body_start = 0;      // stream position where the body begins
    int64_t body_len = -1;      // its Content-Length; -1 none, -2 chunked
    ret = process_request(strm, left == 1, connection_closed, [&](httplib::Request& req) {
      parsed = true;
      body_start = strm.consumed();
      if (req.has_header("Transfer-Encoding")) body_len = -2;
      else if (req.has_header("Content-Length")) body_len = int64_t(req.get_header_value<uint64_t>("Content-Length"));
      read_skipped_body(strm, req, payload_max_length_, st, connection_closed);
    });
    // A request httplib could not parse, or one answered without reading all of its
    // body (a 401 or 413 before the body, a handler that ignored it), leaves bytes
    // that are not the start of a request: the connection cannot go on.
    const size_t body_read = strm.consumed() - body_start;
    const bool body_unread =
        (body_len > 0 && body_read < size_t(body_len)) || (body_len == -2 && body_read == 0);
    if (!ret || connection_closed || left == 1 || !parsed || body_unread) {
      ended_by_request = true;
      break;
    }
  }
  t_conn = nullptr;
  short rev = 0;
  const bool pending = poll_fd(sock, POLLIN, 0, &rev) > 0 && (rev & POLLIN);
  close_connection(sock, !strm.peer_closed() && (ended_by_request || pending || strm.has_buffered()));
  return ret;
}

bool http_client_gone() {
  if (!t_conn || !t_conn->strm) return false;
  if (t_conn->strm->peer_closed()) return true;
  short rev = 0;
  if (poll_fd(t_conn->strm->socket(), POLLIN | POLLRDHUP, 0, &rev) <= 0) return false;
  // POLLIN alone is a pipelined next request: the client is still there.
  return (rev & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

const HttpBodyError* http_body_error() {
  return t_conn && t_conn->has_body_error ? &t_conn->body_error : nullptr;
}

}  // namespace grpo
