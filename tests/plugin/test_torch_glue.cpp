// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern's PyTorch glue (python/cistern/_torch_glue.cpp), compiled against a stand-in of the c10
// declarations it uses (torch_stand_in/) - and, as test_torch_glue_c10, against a real c10 where
// the system has one (without the CUDA observer) - bound to the plug-in on the simulated backend
// (1 GiB):
// under enable() an allocation cistern cannot serve throws c10::OutOfMemoryError (Python:
// torch.OutOfMemoryError) whose message is PyTorch's opening words and cistern's message, any
// other failure throws c10::Error (Python: RuntimeError), and neither leaves anything behind; in
// the MemPool route out of memory is a NULL that PyTorch's allocator retries, and the observer
// turns PyTorch's final out-of-memory into cistern's message.
#include <c10/util/Exception.h>
#ifdef CISTERN_TORCH_POOL_OBSERVER
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <typeinfo>

#include "cistern/plugin.h"

extern "C" {
int cistern_torch_bind(void* try_malloc, void* free_fn);
void* cistern_torch_malloc(std::size_t size, int device, void* stream);
void* cistern_torch_pool_malloc(std::size_t size, int device, void* stream);
void cistern_torch_free(void* ptr, std::size_t size, int device, void* stream);
int cistern_torch_has_pool_observer(void);
int cistern_torch_attach_pool_observer(void);
}

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::int64_t stat(const char* key, int device = 0) {
  std::string text(cistern_memory_stats_json(device, nullptr, 0), '\0');
  cistern_memory_stats_json(device, text.data(), text.size() + 1);
  return nlohmann::json::parse(text).at(key).get<std::int64_t>();
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

void bind() {
  ASSERT_EQ(cistern_torch_bind(reinterpret_cast<void*>(&cistern_try_malloc),
                               reinterpret_cast<void*>(&cistern_free)),
            0);
}

/// The message of the exception that `call` throws, which must be exactly of type `E`.
template <class E, class Call>
std::string thrown(Call&& call) {
  try {
    call();
  } catch (const E& e) {
    EXPECT_EQ(typeid(e), typeid(E));
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

class TorchGlue : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CISTERN_BACKEND", "sim", 1);
    setenv("CISTERN_SIM_CAPACITY", "1GiB", 1);
    unsetenv("CISTERN_ALLOC_CONF");
    cistern_shutdown();
    bind();
  }
  void TearDown() override { cistern_shutdown(); }
};

// First, so that nothing has bound the glue yet in this process.
TEST(TorchGlueUnbound, AllocationBeforeBindingIsAnErrorNotNull) {
  const std::string message = thrown<c10::Error>([] { cistern_torch_malloc(512, 0, nullptr); });
  EXPECT_NE(message.find("cistern_torch_bind was not called"), std::string::npos) << message;
  EXPECT_EQ(cistern_torch_bind(nullptr, nullptr), 1);
}

TEST_F(TorchGlue, ServesAndFreesThroughThePlugin) {
  void* p = cistern_torch_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(stat("requested_bytes.all.current"), 1000);
  EXPECT_EQ(cistern_torch_malloc(0, 0, nullptr), nullptr);  // PyTorch's empty tensors: no throw
  cistern_torch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  void* q = cistern_torch_pool_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(q, nullptr);
  cistern_torch_free(q, 3 * kMiB, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(cistern_misuse_count(), 0u);
}

TEST_F(TorchGlue, OutOfMemoryIsTorchsOutOfMemoryErrorWithCisternsMessage) {
  setenv("CISTERN_ALLOC_CONF", "vmm:False", 1);
  cistern_shutdown();
  cistern_set_memory_fraction(0.5, 0);
  void* held = cistern_torch_malloc(300 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  const std::string message =
      thrown<c10::OutOfMemoryError>([] { cistern_torch_malloc(400 * kMiB, 0, nullptr); });
  EXPECT_EQ(message,
            "CUDA out of memory. cistern: out of memory on device 0: requested 419430400 bytes "
            "(400.00 MiB), of which the device has 724.00 MiB free out of 1.00 GiB. cistern has "
            "300.00 MiB reserved: 300.00 MiB allocated to the program and 0 bytes cached (free "
            "blocks kept for reuse; the largest that could serve this request is 0 bytes). It "
            "may reserve at most 512.00 MiB (memory fraction or limit).");
  // Usable afterwards: consistent, the next allocation served, and the OOM counted once.
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  void* next = cistern_torch_malloc(200 * kMiB, 0, nullptr);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(stat("num_ooms"), 1);
  EXPECT_EQ(stat("allocated_bytes.all.current"), static_cast<std::int64_t>(500 * kMiB));
  cistern_torch_free(next, 200 * kMiB, 0, nullptr);
  cistern_torch_free(held, 300 * kMiB, 0, nullptr);
  EXPECT_EQ(cistern_misuse_count(), 0u);
}

TEST_F(TorchGlue, OutOfMemoryWithCisternsDefaultsKeepsThePrefix) {
  const std::string message =
      thrown<c10::OutOfMemoryError>([] { cistern_torch_malloc(2048 * kMiB, 0, nullptr); });
  EXPECT_TRUE(starts_with(message,
                          "CUDA out of memory. cistern: out of memory on device 0: "
                          "requested 2147483648 bytes (2.00 GiB)"))
      << message;
  EXPECT_NE(cistern_torch_malloc(512 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
}

TEST_F(TorchGlue, OtherFailuresAreErrorsThatAreNotOutOfMemory) {
  std::string message = thrown<c10::Error>([] { cistern_torch_malloc(512, 64, nullptr); });
  EXPECT_TRUE(starts_with(message, "cistern: device 64 is out of range")) << message;
  auto* bogus = reinterpret_cast<void*>(std::uintptr_t{0xdead0});
  message = thrown<c10::Error>([&] { cistern_torch_malloc(512, 0, bogus); });
  EXPECT_NE(message.find("unknown stream handle 0xdead0"), std::string::npos) << message;
  message = thrown<c10::Error>([&] { cistern_torch_pool_malloc(512, -1, nullptr); });
  EXPECT_NE(message.find("device -1 is out of range"), std::string::npos) << message;

  setenv("CISTERN_ALLOC_CONF", "no_such_option:1", 1);
  cistern_shutdown();
  message = thrown<c10::Error>([] { cistern_torch_malloc(512, 0, nullptr); });
  EXPECT_NE(message.find("no_such_option"), std::string::npos) << message;
}

TEST_F(TorchGlue, MemPoolRouteReturnsNullWithoutThrowing) {
  EXPECT_EQ(cistern_torch_pool_malloc(2048 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_OUT_OF_MEMORY);
  void* p = cistern_torch_pool_malloc(kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  cistern_torch_free(p, kMiB, 0, nullptr);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
}

#ifdef CISTERN_TORCH_POOL_OBSERVER
namespace torch_alloc = c10::cuda::CUDACachingAllocator;

TEST_F(TorchGlue, MemPoolRouteReturnsNullAndTheObserverRaisesCisternsMessage) {
  ASSERT_EQ(cistern_torch_has_pool_observer(), 1);
  torch_alloc::stand_in_observers().clear();
  ASSERT_EQ(cistern_torch_attach_pool_observer(), 0);
  ASSERT_EQ(torch_alloc::stand_in_observers().size(), 1u);
  const torch_alloc::OutOfMemoryObserver observer = torch_alloc::stand_in_observers()[0];

  // PyTorch's caching allocator checks for NULL, gives its cached blocks back, retries...
  EXPECT_EQ(cistern_torch_pool_malloc(2048 * kMiB, 0, nullptr), nullptr);
  // ...and when it gives up calls its observers: ours raises cistern's message.
  const std::string message =
      thrown<c10::OutOfMemoryError>([&] { observer(0, 2048 * kMiB, 1 << 30, 1 << 30); });
  EXPECT_TRUE(starts_with(message,
                          "CUDA out of memory. cistern: out of memory on device 0: "
                          "requested 2147483648 bytes"))
      << message;
  EXPECT_NE(message.find("PyTorch's MemPool gave its cached blocks back and retried"),
            std::string::npos);
  // Consumed: an out-of-memory of PyTorch's own afterwards keeps PyTorch's message.
  EXPECT_NO_THROW(observer(0, 2048 * kMiB, 1 << 30, 1 << 30));

  // A retry that cistern serves clears the refusal.
  EXPECT_EQ(cistern_torch_pool_malloc(2048 * kMiB, 0, nullptr), nullptr);
  void* p = cistern_torch_pool_malloc(kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_NO_THROW(observer(0, kMiB, 1 << 30, 1 << 30));
  cistern_torch_free(p, kMiB, 0, nullptr);

  // Another device's out-of-memory is not cistern's refusal on device 0.
  EXPECT_EQ(cistern_torch_pool_malloc(2048 * kMiB, 0, nullptr), nullptr);
  EXPECT_NO_THROW(observer(1, 2048 * kMiB, 1 << 30, 1 << 30));
  EXPECT_THROW(observer(0, 2048 * kMiB, 1 << 30, 1 << 30), c10::OutOfMemoryError);

  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  torch_alloc::stand_in_observers().clear();
}

// The refusal is remembered per thread: another thread's observer call finds nothing.
TEST_F(TorchGlue, MemPoolRefusalsArePerThread) {
  torch_alloc::stand_in_observers().clear();
  ASSERT_EQ(cistern_torch_attach_pool_observer(), 0);
  const torch_alloc::OutOfMemoryObserver observer = torch_alloc::stand_in_observers()[0];
  EXPECT_EQ(cistern_torch_pool_malloc(2048 * kMiB, 0, nullptr), nullptr);
  bool threw = false;
  std::thread other([&] {
    try {
      observer(0, 2048 * kMiB, 1 << 30, 1 << 30);
    } catch (const c10::OutOfMemoryError&) {
      threw = true;
    }
  });
  other.join();
  EXPECT_FALSE(threw);
  EXPECT_THROW(observer(0, 2048 * kMiB, 1 << 30, 1 << 30), c10::OutOfMemoryError);
  torch_alloc::stand_in_observers().clear();
}
#else
TEST_F(TorchGlue, WithoutTheObserverBuildTheMemPoolKeepsPyTorchsMessage) {
  EXPECT_EQ(cistern_torch_has_pool_observer(), 0);
  EXPECT_EQ(cistern_torch_attach_pool_observer(), 1);
}
#endif

}  // namespace
