// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "device_call.hpp"

#include <fmt/format.h>

#include "cistern/errors.hpp"

namespace cistern::detail {

void throw_device_error(const Device& device, Status status, DeviceOp op) {
  const std::string detail = device.last_error();
  throw DeviceError(to_string(op), fmt::format("cistern: device {} failed: {} ({}){}{}",
                                               device.name(), to_string(op), to_string(status),
                                               detail.empty() ? "" : ": ", detail));
}

}  // namespace cistern::detail
