// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writing a command's output file (a report, a converted trace), or stdout for "-". Every write
// is checked (snapshot/file_output.hpp): a full disk is an error naming the file, never exit 0.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cistern/errors.hpp"
#include "cli/cli.hpp"
#include "snapshot/file_output.hpp"

namespace cistern::cli {
namespace {

[[noreturn]] void cannot_write(const std::string& path, const std::string& what, int error) {
  throw InvalidArgument(fmt::format("{}: cannot write '{}': {}", what, path, std::strerror(error)));
}

/// Whether a file may be created at `path`: creates it (and nothing else) and removes it again.
void check_creatable(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) cannot_write(path, what, errno);
  ::close(fd);
  ::unlink(path.c_str());
}

}  // namespace

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty() || path == "-") return;
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno != ENOENT) cannot_write(path, what, errno);  // ENOTDIR, EACCES, ELOOP, ...
    check_creatable(path, what);
    return;
  }
  if (S_ISDIR(info.st_mode)) cannot_write(path, what, EISDIR);
  if (!S_ISREG(info.st_mode)) return;  // a device or a pipe: opening it could block or act
  // Opened for writing without truncation: the file is left as it is until the work is done.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) cannot_write(path, what, errno);
  ::close(fd);
}

void write_output(const std::string& path, const std::string& content, const std::string& what) {
  if (path == "-") {
    detail::write_stdout(content);
    return;
  }
  detail::write_whole_file(path, content, what);
}

}  // namespace cistern::cli
