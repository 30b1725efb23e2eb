// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SpinLock: the lock of a stream pool.
//
// A pool lock is held for a few hundred instructions on the cache-hit path and is almost never
// contended (one stream is usually driven by one thread), so an uncontended lock/unlock must be
// one atomic exchange and one release store - a pthread mutex costs several times that. When it
// is contended (a slow path holding it across a device call), waiters back off from spinning to
// yielding to sleeping, so that a thread waiting for a cudaMalloc does not burn a core.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace cistern::detail {

class SpinLock {
 public:
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    lock_contended();
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    for (unsigned round = 0;; ++round) {
      while (locked_.load(std::memory_order_relaxed)) back_off(round++);
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }
  static void back_off(unsigned round) noexcept {
    if (round < 64) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else if (round < 1024) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::atomic<bool> locked_{false};
};

}  // namespace cistern::detail
