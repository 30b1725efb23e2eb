// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A test-only stand-in for the part of PyTorch's <c10/util/Exception.h> that cistern's PyTorch
// glue (python/cistern/_torch_glue.cpp) uses, so that the glue's logic is compiled and tested
// where PyTorch is not installed. It mirrors PyTorch's declarations: `c10::Error` carries the
// message (`what_without_backtrace()` is what PyTorch's Python binding shows),
// `c10::OutOfMemoryError` derives from it (Python: torch.OutOfMemoryError), and
// TORCH_CHECK_WITH(ErrorType, condition, message) / TORCH_CHECK(condition, message) throw
// `c10::ErrorType` / `c10::Error` with exactly `message` when the condition is false.
// The real header is used on the GPU machine (scripts/gpu_frameworks.py builds the glue there).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace c10 {

struct SourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};

class Error : public std::exception {
 public:
  Error(SourceLocation location, std::string message)
      : location_(location), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const char* what_without_backtrace() const noexcept { return message_.c_str(); }
  const std::string& msg() const { return message_; }
  const SourceLocation& location() const { return location_; }

 private:
  SourceLocation location_;
  std::string message_;
};

class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

}  // namespace c10

#define TORCH_CHECK_WITH(error_t, cond, message)                                           \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      throw ::c10::error_t(                                                                \
          ::c10::SourceLocation{__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)}, \
          std::string(message));                                                           \
    }                                                                                      \
  } while (false)

#define TORCH_CHECK(cond, message) TORCH_CHECK_WITH(Error, cond, message)
