// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Text helpers of the cistern trace format shared by its reader and writer: how free text
// (format names, settings) becomes one whitespace-free token and back, and gzip output.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cistern::trace::native {

/// `text` as one token: bytes that are blank, control, non-ASCII, '\\' or '"' become \xNN; the
/// empty text becomes "".
std::string escape(std::string_view text);

/// The text a token stands for, or nothing if the token has a malformed escape.
std::optional<std::string> unescape(std::string_view token);

/// `bytes` compressed as one gzip member. `name` labels errors.
std::string gzip(std::string_view bytes, const std::string& name);

}  // namespace cistern::trace::native
