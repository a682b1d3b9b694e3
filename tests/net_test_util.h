// Networking helpers shared by the test binaries of several areas (server, dist).
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace grpo::test {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back, closed).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  const int port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

}  // namespace grpo::test
