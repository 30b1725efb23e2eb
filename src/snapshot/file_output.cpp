// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "snapshot/file_output.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "cistern/errors.hpp"

namespace cistern::detail {
namespace {

/// The reason for the failure that just happened; errno is 0 when the C library did not say.
std::string os_reason(int error) {
  return error != 0 ? std::strerror(error) : std::string("write error");
}

/// Clears standard output's error state and throws for the failure `error` (an errno value).
[[noreturn]] void stdout_failed(int error) {
  std::cout.clear();
  std::clearerr(stdout);
  throw InvalidArgument(fmt::format("cannot write to standard output: {}", os_reason(error)));
}

}  // namespace

void write_whole_file(const std::string& path, std::string_view bytes, std::string_view what) {
  const auto fail = [&](int error) {
    throw InvalidArgument(fmt::format("{}: cannot write '{}': {}", what, path, os_reason(error)));
  };
  errno = 0;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) fail(errno);
  errno = 0;
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size() &&
                       std::fflush(file) == 0 && std::ferror(file) == 0;
  const int write_error = errno;
  // fclose reports what the final flush (or a network file system) found; it must run even
  // after a failed write, to release the handle.
  errno = 0;
  const bool closed = std::fclose(file) == 0;
  if (!written) fail(write_error);
  if (!closed) fail(errno);
}

void flush_stdout() {
  errno = 0;
  std::cout.flush();
  const int stream_error = errno;
  const bool stream_good = static_cast<bool>(std::cout);
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0 && std::ferror(stdout) == 0;
  if (stream_good && flushed) return;
  stdout_failed(errno != 0 ? errno : stream_error);
}

void write_stdout(std::string_view text) {
  errno = 0;
  std::cout.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!std::cout) stdout_failed(errno);
  flush_stdout();
}

}  // namespace cistern::detail
