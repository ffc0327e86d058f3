#include "common/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace hetps {

absl::StatusOr<std::vector<int>> PickFreePorts(const std::string& host,
                                               int count) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
      status = absl::InvalidArgumentError(
          absl::StrCat("cluster.host: '", host, "' is not an IPv4 address"));
    } else if (fd < 0 ||
               bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
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

}  // namespace hetps
