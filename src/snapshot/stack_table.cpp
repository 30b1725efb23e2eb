// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// StackTable (include/cistern/stacks.hpp).
#include <limits>
#include <string>

#include "cistern/errors.hpp"
#include "cistern/stacks.hpp"

namespace cistern {
namespace {

/// The map key of a frame: the three fields, unambiguous (the line's 8 bytes, then the
/// filename's length, then both strings).
std::string frame_key(std::string_view filename, std::int64_t line, std::string_view name) {
  std::string key(reinterpret_cast<const char*>(&line), sizeof line);
  const std::size_t length = filename.size();
  key.append(reinterpret_cast<const char*>(&length), sizeof length);
  key.append(filename);
  key.append(name);
  return key;
}

std::uint32_t next_id(std::size_t size) {
  if (size >= std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument("stack table: more than 2^32 - 1 distinct frames or stacks");
  }
  return static_cast<std::uint32_t>(size);
}

}  // namespace

StackTable::StackTable() : stacks_(1) {}

std::uint32_t StackTable::frame_id(std::string_view filename, std::int64_t line,
                                   std::string_view name) {
  const auto [it, added] = frame_ids_.emplace(frame_key(filename, line, name), 0);
  if (added) {
    it->second = next_id(frames_.size());
    frames_.push_back(StackFrame{std::string(filename), line, std::string(name)});
  }
  return it->second;
}

std::uint32_t StackTable::stack_id(const std::vector<std::uint32_t>& frames) {
  if (frames.empty()) return 0;
  for (const std::uint32_t id : frames) {
    if (id >= frames_.size()) throw InvalidArgument("stack table: unknown frame id");
  }
  std::string key(reinterpret_cast<const char*>(frames.data()), frames.size() * sizeof frames[0]);
  const auto [it, added] = stack_ids_.emplace(std::move(key), 0);
  if (added) {
    it->second = next_id(stacks_.size());
    stacks_.push_back(frames);
  }
  return it->second;
}

const std::vector<std::uint32_t>& StackTable::stack(std::uint32_t id) const {
  if (id >= stacks_.size()) throw InvalidArgument("stack table: unknown stack id");
  return stacks_[id];
}

const StackFrame& StackTable::frame(std::uint32_t id) const {
  if (id >= frames_.size()) throw InvalidArgument("stack table: unknown frame id");
  return frames_[id];
}

}  // namespace cistern
