// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A one-line progress bar on stderr for long replays. It draws only when stderr is a terminal,
// and only once the work is worth watching (more than a few jobs, or more than a second), so
// that pipes, logs and JSON output never see it. Updates may come from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace cistern::cli {

/// A progress bar: "replay [#######-------]  12/40  30%  4.1s".
class Progress {
 public:
  /// `enabled`: whether the user allows it at all (false with --quiet); it also needs a
  /// terminal on stderr.
  Progress(std::string label, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Reports `done` of `total` jobs finished. Redraws at most ten times a second.
  void update(std::size_t done, std::size_t total);
  /// Erases the bar (it never stays behind in the terminal's scrollback).
  void finish();

 private:
  void draw(std::size_t done, std::size_t total, double seconds);

  std::string label_;
  bool active_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  std::mutex mutex_;
};

}  // namespace cistern::cli
