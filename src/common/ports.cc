#include "common/ports.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace hetps {
namespace {

// Drawn ports stay at or above this (clear of the registered services most
// machines run) and below the ephemeral range.
constexpr int kLowestDrawnPort = 20000;
// Fewer ports than this between the two: let the kernel pick instead.
constexpr int kLeastRoom = 1000;
// Draws per port before giving up on drawing for it.
constexpr int kDraws = 64;

// The first port of the kernel's ephemeral range (Linux's default when the
// setting cannot be read).
int EphemeralLow() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(range >> low) || low <= 0) low = 32768;
  return low;
}

// Binds `fd` to `port` on `addr`'s host; port 0 lets the kernel pick.
bool BindTo(int fd, sockaddr_in addr, int port) {
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

}  // namespace

absl::StatusOr<std::vector<int>> PickFreePorts(const std::string& host,
                                               int count) {
  std::vector<int> fds, ports;
  absl::Status status;
  const int ephemeral_low = EphemeralLow();
  const bool draw = ephemeral_low - kLowestDrawnPort >= kLeastRoom;
  absl::BitGen random;
  for (int i = 0; i < count && status.ok(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
      status = absl::InvalidArgumentError(
          absl::StrCat("cluster.host: '", host, "' is not an IPv4 address"));
      if (fd >= 0) fds.push_back(fd);
      break;
    }
    bool bound = false;
    for (int d = 0; draw && fd >= 0 && !bound && d < kDraws; ++d) {
      bound = BindTo(fd, addr,
                     absl::Uniform(random, kLowestDrawnPort, ephemeral_low));
    }
    if (fd < 0 || !(bound || BindTo(fd, addr, 0))) {
      status =
          absl::UnavailableError(absl::StrCat("cannot bind a port on ", host));
    } else {
      socklen_t len = sizeof addr;
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", endpoint, "' is not host:port"));
  }
  const std::string host = endpoint.substr(0, colon);
  const std::string port = endpoint.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", endpoint, ": ", gai_strerror(e)));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok =
      fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  freeaddrinfo(found);
  if (fd >= 0) close(fd);
  if (!ok) {
    return absl::UnavailableError(
        absl::StrCat("no route from this machine to ", endpoint));
  }
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return std::string(text);
}

}  // namespace hetps
