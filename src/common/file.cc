#include "common/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hetps {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  auto unreadable = [&path](int error) {
    const std::string message = absl::StrCat("cannot read '", path, "' (",
                                             std::strerror(error), ")");
    return error == ENOENT || error == EISDIR ? absl::NotFoundError(message)
                                              : absl::InternalError(message);
  };
  // Plain POSIX reads: unlike ifstream they report a directory (EISDIR).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return unreadable(errno);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return unreadable(error);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

}  // namespace hetps
