// HttpEndpoint: the small HTTP server of a server process, for Prometheus
// (/metrics) and, on server 0, the dashboard and its JSON. GET only; each
// route is a function called per request on the endpoint's threads.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace hetps {

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpEndpoint {
 public:
  using Route = std::function<HttpReply()>;

  // Listens on address:port (port 0: a free one) and serves `routes` and
  // `open_routes` by exact path. A non-empty `token`: requests for `routes`
  // without `Authorization: Bearer <token>` (or, for a browser, `?token=`)
  // get 401; `open_routes` (the dashboard's page and scripts, no data) are
  // served to anyone who reaches the address. UNAVAILABLE when the address
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& address, int port, std::string token,
      std::map<std::string, Route> routes,
      std::map<std::string, Route> open_routes = {});
  ~HttpEndpoint();  // stops serving; waits for running requests

  int port() const { return port_; }

 private:
  HttpEndpoint() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace hetps
