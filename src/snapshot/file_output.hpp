// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writing a whole file with every error checked: opening, writing, flushing and closing each
// report the OS reason ("No space left on device"), so that an output is either complete or an
// error, never lost in silence. The snapshot writer, the trace writer and the cistern command
// share it.
#pragma once

#include <string>
#include <string_view>

namespace cistern::detail {

/// Replaces the file at `path` with `bytes`. Throws `cistern::InvalidArgument`
/// "<what>: cannot write '<path>': <OS reason>" when any step fails (a partial file may remain).
void write_whole_file(const std::string& path, std::string_view bytes, std::string_view what);

/// Flushes standard output (C++ and C streams). Throws `cistern::InvalidArgument`
/// "cannot write to standard output: <OS reason>" when any write to it failed.
void flush_stdout();

/// Writes `text` to standard output and flushes it, with the same error. A large text fails in
/// the write itself (before any flush), so the OS reason is taken there.
void write_stdout(std::string_view text);

}  // namespace cistern::detail
