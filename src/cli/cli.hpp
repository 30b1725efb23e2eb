// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// What the subcommands of the `cistern` program share: exit codes, the usage-error exception,
// and how a subcommand is registered with the argument parser and run after parsing.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace cistern::cli {

/// The program's exit status. Documented in `cistern --help`; scripts rely on them.
enum ExitCode : int {
  kExitOk = 0,           ///< success
  kExitFailure = 1,      ///< an unexpected internal error (a bug: please report it)
  kExitUsage = 2,        ///< bad command line: unknown flag, bad value, unknown policy
  kExitBadInput = 3,     ///< a trace is missing, unreadable or malformed; an output unwritable
  kExitOutOfMemory = 4,  ///< a replay ran out of memory at the given capacity
  kExitNoDevice = 5,     ///< --backend cuda: no usable GPU (or built without CUDA)
};

/// The exit-code paragraph shown at the end of every `--help`.
inline constexpr const char* kExitCodesHelp =
    "Exit status: 0 success, 2 usage error (unknown flag, bad value, unknown policy),\n"
    "3 bad input or output (missing, unreadable or malformed trace; an output that cannot be\n"
    "written), 4 a replay ran out of memory at\n"
    "the given --capacity, 5 no usable GPU for --backend cuda, 1 internal error.";

/// A command line that parses but cannot be carried out as written (an unknown policy, a bad
/// --capacity, a combination of flags that makes no sense). Exits with `kExitUsage`.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Writes `content` to the file `path`, or to stdout for "-". Throws `cistern::InvalidArgument`
/// (exit 3) naming `what` (the flag or command that named the file), the path and the OS
/// reason when it cannot be written.
void write_output(const std::string& path, const std::string& content, const std::string& what);

/// Checks, before any work, that `write_output(path, ..., what)` could write `path`: that it is
/// not a folder, that an existing file opens for writing (it is not changed), and that a new one
/// can be created (it is created and removed). Nothing to check for "" (no output) and "-"
/// (stdout); devices and pipes are left to the write. Throws `cistern::InvalidArgument` (exit 3)
/// "<what>: cannot write '<path>': <OS reason>", as the write itself would.
void check_output_path(const std::string& path, const std::string& what);

/// A registered subcommand: its parser node, and what to run when the user chose it.
struct Command {
  CLI::App* app = nullptr;
  /// Runs the command; gets the whole command line (for reports). Returns an ExitCode; throws
  /// UsageError or cistern::Error.
  std::function<int(const std::string& command_line)> run;
};

/// `cistern replay TRACE...`: replay traces under allocator policies, report the figures.
Command add_replay_command(CLI::App& parent);
/// `cistern info TRACE`: what a trace holds.
Command add_info_command(CLI::App& parent);
/// `cistern convert INPUT OUTPUT`: rewrite a trace in another format.
Command add_convert_command(CLI::App& parent);
/// `cistern advise TRACE...`: the PYTORCH_ALLOC_CONF that needs the smallest device, and cistern's.
Command add_advise_command(CLI::App& parent);
/// `cistern plan TRACE...`: plan each trace's allocations into one arena ahead of time.
Command add_plan_command(CLI::App& parent);

}  // namespace cistern::cli
