// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Turning device statuses into exceptions, in one place.
#pragma once

#include "cistern/device.hpp"

namespace cistern::detail {

/// Throws the DeviceError that describes a failed device call (with the backend's detail).
[[noreturn]] void throw_device_error(const Device& device, Status status, DeviceOp op);

/// Throws unless `status` is ok.
inline void check_device(const Device& device, Status status, DeviceOp op) {
  if (status != Status::ok) throw_device_error(device, status, op);
}

}  // namespace cistern::detail
