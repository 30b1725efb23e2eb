// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The README's option list comes from the options table: this test fails when they drift
// (regenerate the table with `cistern options`).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "cistern/config.hpp"

namespace {

TEST(Readme, OptionTableMatchesTheOptionsTable) {
  std::ifstream in(std::string(CISTERN_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << "README.md not found in " << CISTERN_SOURCE_DIR;
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(cistern::options_markdown()), std::string::npos)
      << "README.md must contain the options table exactly as options_markdown() prints it:\n"
      << cistern::options_markdown();
}

}  // namespace
