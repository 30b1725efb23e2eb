// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writing a command's output file (a report, a converted trace), or stdout for "-". Every write
// is checked (snapshot/file_output.hpp): a full disk is an error naming the file, never exit 0.
#include <string>

#include "cli/cli.hpp"
#include "snapshot/file_output.hpp"

namespace cistern::cli {

void write_output(const std::string& path, const std::string& content, const std::string& what) {
  if (path == "-") {
    detail::write_stdout(content);
    return;
  }
  detail::write_whole_file(path, content, what);
}

}  // namespace cistern::cli
