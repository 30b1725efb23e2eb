// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The `cistern` program: subcommand dispatch and the mapping from errors to exit codes. Every
// subcommand lives in its own file; this one only parses and reports.
#include <CLI/CLI.hpp>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cistern/config.hpp"
#include "cistern/errors.hpp"
#include "cli/cli.hpp"
#include "snapshot/file_output.hpp"

#ifndef CISTERN_VERSION
#define CISTERN_VERSION "unknown"
#endif

namespace cistern::cli {
namespace {

Command add_options_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "options", "Print the allocator options table (CISTERN_ALLOC_CONF keys, policy options)");
  app->footer(kExitCodesHelp);
  return {app, [](const std::string&) {
            detail::write_stdout(options_markdown());
            return kExitOk;
          }};
}

/// `text` with line breaks at word boundaries so that no line is longer than `width`; CLI11
/// indents every following line under the first.
std::string wrap(const std::string& text, std::size_t width) {
  std::string out, word;
  std::size_t column = 0;
  const auto put_word = [&] {
    if (word.empty()) return;
    if (column > 0 && column + 1 + word.size() > width) {
      out += '\n';
      column = 0;
    } else if (column > 0) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    word.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == '\n') put_word();
    else word += c;
  }
  put_word();
  return out;
}

/// Wraps every description so that `--help` reads in a 100-column terminal: options start at
/// column 30 (CLI11's default), so their text gets 68 columns.
void wrap_help(CLI::App& app) {
  for (CLI::Option* option : app.get_options({}))
    option->description(wrap(option->get_description(), 68));
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->description(wrap(sub->get_description(), 68));
    wrap_help(*sub);
  }
}

std::string join_arguments(int argc, char** argv) {
  std::string text = "cistern";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool plain = arg.find_first_of(" \t\"'$\\") == std::string::npos && !arg.empty();
    text += " " + (plain ? arg : "'" + arg + "'");
  }
  return text;
}

/// The deepest subcommand the parser reached, for the "see --help" hint.
std::string help_hint(const CLI::App& app) {
  std::string name = "cistern";
  for (const CLI::App* sub : app.get_subcommands()) name += " " + sub->get_name();
  return "Run '" + name + " --help' for usage.";
}

int fail(int code, const std::string& message) {
  std::cerr << "cistern: " << message << "\n";
  return code;
}

int run(int argc, char** argv) {
  CLI::App app(
      "cistern: a caching device-memory allocator for CUDA, and a tool that replays "
      "real allocation traces to compare allocators.",
      "cistern");
  app.set_version_flag("--version", std::string("cistern ") + CISTERN_VERSION);
  app.require_subcommand(1);
  app.footer(kExitCodesHelp);
  const std::vector<Command> commands = {add_replay_command(app),  add_info_command(app),
                                         add_convert_command(app), add_options_command(app),
                                         add_advise_command(app),  add_plan_command(app)};
  wrap_help(app);
  app.description(wrap(app.get_description(), 98));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (argc == 1) {
      std::cerr << app.help();
      return kExitUsage;
    }
    return fail(kExitUsage, std::string(e.what()) + "\n" + help_hint(app));
  }
  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run(join_arguments(argc, argv));
    } catch (const UsageError& e) {
      return fail(kExitUsage, std::string(e.what()) + "\n" + help_hint(app));
    }
  }
  return fail(kExitUsage, "no command given\n" + help_hint(app));
}

/// Runs the command, then makes sure that what it printed reached stdout: a full disk or a
/// closed pipe is an error (exit 3), never a silent exit 0.
int run_and_flush(int argc, char** argv) {
  const int code = run(argc, argv);
  cistern::detail::flush_stdout();
  return code;
}

}  // namespace
}  // namespace cistern::cli

int main(int argc, char** argv) {
  using namespace cistern::cli;
  try {
    return run_and_flush(argc, argv);
  } catch (const cistern::InvalidArgument& e) {
    return fail(kExitBadInput, e.what());
  } catch (const cistern::OutOfMemory& e) {
    return fail(kExitOutOfMemory, e.what());
  } catch (const std::bad_alloc&) {
    return fail(kExitOutOfMemory, "out of host memory");
  } catch (const std::exception& e) {
    return fail(kExitFailure, std::string("internal error: ") + e.what());
  }
}
