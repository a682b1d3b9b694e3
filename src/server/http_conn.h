// ConnServer: a cpp-httplib 0.11 server that runs its connections itself, so that a
// handler can learn two things httplib 0.11 hides from it:
//   - whether its client is still there (http_client_gone(): the peer closed or
//     reset the socket), so that a non-streaming generation aborts and frees its KV
//     blocks when the client leaves;
//   - the body of a request whose method httplib does not read bodies for (GET,
//     HEAD, OPTIONS): Atropos environments send GET /status-env with a JSON body.
//     ConnServer reads it (Content-Length, gzip allowed) into req.body before
//     routing, so the connection stays in step for the next keep-alive request.
//
// It overrides httplib's per-connection entry point (the virtual
// process_and_close_socket) with its own keep-alive loop and socket stream, and
// hands each request to httplib's protected process_request; parsing, routing and
// response writing stay httplib's. The thread-local accessors below answer for the
// request the calling worker thread is handling, and are neutral elsewhere.
//
// Closing: when the server ends a connection that may still carry unread bytes (an
// oversized or unreadable body, Connection: close with a body in flight), it sends
// FIN first and drains briefly before close(), so the client reads the whole
// response instead of losing it to a TCP reset.
#pragma once
#include <httplib.h>

#include <string>

namespace grpo {

class ConnServer : public httplib::Server {
 private:
  bool process_and_close_socket(socket_t sock) override;
};

// A body ConnServer could not read for a method httplib does not read bodies for.
// The connection closes after the response; the handler should answer `status`.
struct HttpBodyError {
  int status = 0;       // 400, 411 or 413
  std::string message;  // names the problem and what to send instead
};

// True when the client of the request this thread is handling has closed or reset
// its connection. A client that half-closes (shutdown of its write side) after its
// request counts as gone, as with most HTTP servers. False off a ConnServer thread.
bool http_client_gone();

// The body error of the request this thread is handling, or null when none (or off a
// ConnServer thread). Servers check it first in their pre-routing handler.
const HttpBodyError* http_body_error();

}  // namespace grpo
