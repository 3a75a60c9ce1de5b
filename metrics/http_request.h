// HttpRequestHead: the bounded reading of one HTTP/1.x request head, for the metrics
// endpoint (metrics/metrics_server.h).
//
// The endpoint serves GET and HEAD of a handful of paths and nothing else, so the parser
// knows only what that needs: the request line, the Connection, Content-Length and
// Transfer-Encoding headers (every other header is counted and skipped), and the limits.
// It is handed the bytes received so far and judges them as they come: a request line or
// a head past its limit is refused as soon as the bytes prove it, without waiting for
// the end of the line or the head, so a connection never holds more than
// Limits::max_head_bytes.  A body is never read: a request that announces one
// (Content-Length other than 0, or any Transfer-Encoding) is answered and the
// connection closed.
//
// Thread-safety: a plain function of its arguments.
#ifndef KVENGINE_METRICS_HTTP_REQUEST_H_
#define KVENGINE_METRICS_HTTP_REQUEST_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace kvengine {

struct HttpRequestHead {
  struct Limits {
    size_t max_request_line = 2048;  // method, target and version: past it, 414
    size_t max_head_bytes = 8192;    // the request line and every header: past it, 431
    size_t max_headers = 64;         // header lines: past it, 431
  };

  enum class Result {
    kIncomplete,  // the head has not ended yet and no limit is passed: read more
    kComplete,    // a head within the limits; *consumed is its length
    kRefused,     // refused: answer `status` (with `reason`) and close the connection
  };

  std::string method;
  std::string path;  // the target without its query string
  bool http11 = false;
  bool keep_alive = false;  // HTTP/1.1 unless "Connection: close"; 1.0 only if asked
  bool has_body = false;    // Content-Length other than 0, or a Transfer-Encoding
  int status = 0;           // with kRefused: 400, 414, 431, 505
  std::string reason;       // with kRefused: why, for the answer's body

  // Parses the head at the start of `bytes`, LF or CRLF line ends.  On kComplete fills
  // the fields above and sets *consumed to the head's length (its blank line included);
  // on kRefused sets status and reason.  `bytes` may hold more than the head (a
  // pipelined request); only *consumed bytes belong to this one.
  Result Parse(std::string_view bytes, const Limits& limits, size_t* consumed);
};

}  // namespace kvengine

#endif  // KVENGINE_METRICS_HTTP_REQUEST_H_
