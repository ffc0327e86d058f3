#include "metrics/http_endpoint.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hetps {

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& address, int port, std::string token,
    std::map<std::string, Route> routes,
    std::map<std::string, Route> open_routes) {
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  endpoint->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *endpoint->server_;
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which
  // a second process binds the same port and takes half the scrapes.
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Few, short requests: a scraper and a dashboard or two.
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  auto serve = [](const Route& route, httplib::Response& response) {
    HttpReply reply = route();
    response.status = reply.status;
    response.set_content(std::move(reply.body), reply.content_type);
  };
  for (auto& [path, route] : open_routes) {
    server.Get(path, [route = std::move(route), serve](
                         const httplib::Request&, httplib::Response& response) {
      serve(route, response);
    });
  }
  for (auto& [path, route] : routes) {
    server.Get(path, [route = std::move(route), token, serve](
                         const httplib::Request& request,
                         httplib::Response& response) {
      if (!token.empty() &&
          request.get_header_value("Authorization") !=
              absl::StrCat("Bearer ", token) &&
          request.get_param_value("token") != token) {
        response.status = 401;
        response.set_content("a bearer token is required (auth.token_*)\n",
                             "text/plain");
        return;
      }
      serve(route, response);
    });
  }
  endpoint->port_ = port == 0 ? server.bind_to_any_port(address)
                              : (server.bind_to_port(address, port) ? port : -1);
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "metrics: cannot listen on ", address, ":", port,
        " (address in use or not local? metrics.address / metrics.port)"));
  }
  auto ended = std::make_shared<std::atomic<bool>>(false);
  endpoint->thread_ = std::thread([&server, ended] {
    server.listen_after_bind();
    *ended = true;
  });
  // A stop() before the loop runs would be lost and the destructor's join
  // would wait forever: wait for the loop (or its failure).
  while (!server.is_running() && !*ended) std::this_thread::yield();
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace hetps
