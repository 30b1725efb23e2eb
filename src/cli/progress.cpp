// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "cli/progress.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

namespace cistern::cli {
namespace {

/// Jobs up to this many finish too fast to need a bar unless they take over a second.
constexpr std::size_t kFewJobs = 4;
constexpr double kSlowSeconds = 1.0;

int terminal_columns() {
  winsize size{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 20) return size.ws_col;
  return 80;
}

}  // namespace

Progress::Progress(std::string label, bool enabled)
    : label_(std::move(label)),
      active_(enabled && isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::update(std::size_t done, std::size_t total) {
  if (!active_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (total <= kFewJobs && seconds < kSlowSeconds) return;
  if (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(done, total, seconds);
}

void Progress::draw(std::size_t done, std::size_t total, double seconds) {
  const std::string counts = fmt::format(
      " {}/{} {:3.0f}% {:.1f}s", done, total,
      total == 0 ? 100.0 : 100.0 * static_cast<double>(done) / static_cast<double>(total), seconds);
  const int room = terminal_columns() - 1 - static_cast<int>(label_.size() + counts.size()) - 3;
  const std::size_t width = static_cast<std::size_t>(std::clamp(room, 10, 50));
  const std::size_t filled = total == 0 ? width : width * done / total;
  const std::string bar = std::string(filled, '#') + std::string(width - filled, '-');
  std::fprintf(stderr, "\r%s [%s]%s\033[K", label_.c_str(), bar.c_str(), counts.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (!active_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (drawn_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
  drawn_ = false;
  active_ = false;
}

}  // namespace cistern::cli
