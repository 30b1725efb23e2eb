// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Helpers of the trace reader tests: scratch files, expected errors, and comparing traces.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>

#include "cistern/errors.hpp"
#include "trace/trace.hpp"

namespace cistern::testing {

/// A scratch directory, removed with everything in it at destruction.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("cistern-readers-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  /// The path of the file `name` in the directory.
  std::string path(const std::string& name) const { return (path_ / name).string(); }

  /// Writes `bytes` to the file `name` in the directory; returns its path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string path = this->path(name);
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

 private:
  std::filesystem::path path_;
};

/// The message of the `cistern::InvalidArgument` that `action` throws, or "" (with a test
/// failure) when it throws nothing. Any other exception escapes and fails the test.
template <class Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected cistern::InvalidArgument, nothing was thrown";
  return "";
}

/// Expects `message` to contain every one of `parts`.
inline void expect_contains(const std::string& message,
                            std::initializer_list<std::string_view> parts) {
  for (const std::string_view part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

inline auto fields(const trace::Event& e) {
  return std::tie(e.op, e.stream, e.id, e.size, e.addr, e.time);
}
inline auto fields(const trace::LiveBlock& b) { return std::tie(b.id, b.size, b.addr, b.stream); }
inline auto fields(const trace::RecordedSegment& s) {
  return std::tie(s.addr, s.size, s.stream, s.is_large, s.is_expandable);
}
inline auto fields(const trace::RecordedSegmentEvent& s) {
  return std::tie(s.kind, s.before_event, s.addr, s.size, s.stream, s.time);
}
inline auto fields(const trace::RecordedFreeCompletion& c) {
  return std::tie(c.id, c.before_event, c.time);
}
inline auto fields(const trace::RecordedOom& o) {
  return std::tie(o.before_event, o.size, o.device_free, o.stream, o.time);
}

/// Expects equal lists, reporting the first differing index.
template <class T>
void expect_same_list(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(fields(a[i]) == fields(b[i])) << what << "[" << i << "] differs";
  }
}

/// Expects two traces to be identical in everything but `source`.
inline void expect_same_trace(const trace::Trace& a, const trace::Trace& b) {
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.streams, b.streams);
  expect_same_list(a.live_before, b.live_before, "live_before");
  expect_same_list(a.events, b.events, "events");
  const trace::Recorded& x = a.recorded;
  const trace::Recorded& y = b.recorded;
  expect_same_list(x.initial_segments, y.initial_segments, "initial_segments");
  expect_same_list(x.segment_events, y.segment_events, "segment_events");
  EXPECT_EQ(x.initial_reserved, y.initial_reserved);
  EXPECT_EQ(x.peak_reserved, y.peak_reserved);
  EXPECT_EQ(x.reserved_samples, y.reserved_samples);
  EXPECT_EQ(x.settings, y.settings);
  expect_same_list(x.deferred_frees, y.deferred_frees, "deferred_frees");
  expect_same_list(x.ooms, y.ooms, "ooms");
}

}  // namespace cistern::testing
