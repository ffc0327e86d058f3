#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
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
  // Read straight into the string, sized from fstat (checkpoint files run
  // to gigabytes); a file that grows meanwhile is read to its end.
  struct stat st;
  std::string text;
  text.resize(fstat(fd, &st) == 0 && st.st_size > 0
                  ? static_cast<size_t>(st.st_size) + 1
                  : size_t{1} << 16);
  size_t size = 0;
  while (true) {
    if (size == text.size()) text.resize(text.size() * 2);
    const ssize_t n = read(fd, text.data() + size, text.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return unreadable(error);
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(size);
  return text;
}

}  // namespace hetps
