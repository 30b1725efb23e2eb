// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writing a command's output file (a report, a converted trace), or stdout for "-".
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <string>

#include "cli/cli.hpp"

namespace cistern::cli {

void write_output(const std::string& path, const std::string& content, const std::string& what) {
  if (path == "-") {
    std::cout << content << std::flush;
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) throw UsageError(fmt::format("{}: cannot write '{}'", what, path));
}

}  // namespace cistern::cli
