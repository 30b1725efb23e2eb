// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern as a CCCL memory resource: `cistern::cccl::memory_resource` adapts any
// `cistern::Allocator` (a `CachingAllocator`, typically) to the `cuda::mr` concepts, so that
// CCCL containers and algorithms (and anything else written against `cuda::mr`) allocate
// through cistern:
//
//   cistern::CudaDevice device;
//   cistern::CachingAllocator allocator(device);
//   cistern::cccl::memory_resource resource(allocator);
//   void* p = resource.allocate_async(1 << 20, 256, cuda::stream_ref{stream});
//   resource.deallocate_async(p, 1 << 20, 256, cuda::stream_ref{stream});
//
// Which concepts: both generations of CCCL's. CUDA 13.0 ships CCCL 3.0, whose
// `<cuda/memory_resource>` defines `cuda::mr::resource` (allocate / deallocate with size and
// alignment, equality) and `cuda::mr::async_resource` (plus allocate_async / deallocate_async on a
// `cuda::stream_ref`), behind the opt-in macro LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE.
// CCCL 3.1 (CUDA 13.1, and the RMM built on it) renames the synchronous concept
// `cuda::mr::synchronous_resource` (allocate_sync / deallocate_sync) and gives `cuda::mr::resource`
// the stream-ordered meaning with the stream first: allocate(stream, bytes, alignment) and
// deallocate(stream, ptr, bytes, alignment). The adaptor has every member both require, with the
// `cuda::mr::device_accessible` property; tests/plugin/test_cccl_resource.cpp checks the
// installed CCCL's concepts with static_assert, and the other generation's member signatures.
//
//   void* p = resource.allocate(cuda::stream_ref{stream}, 1 << 20, 256);     // CCCL 3.1
//   resource.deallocate(cuda::stream_ref{stream}, p, 1 << 20, 256);
//
// This header defines LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE when it is not defined, so
// before CCCL 3.2 (which needs no macro) it must come before any other inclusion of
// <cuda/memory_resource> (or define the macro for the whole build). It needs the CUDA toolkit's
// include directories (nvcc adds them; for a host compiler add `<cuda>/include` and
// `<cuda>/include/cccl`).
//
// Semantics: `allocate(bytes, ...)` / `deallocate(ptr, bytes, ...)` and the `_sync` forms are on
// the legacy default stream (usable by every stream at once, as the synchronous concept
// promises); the `_async` and stream-first forms on the given stream. The
// alignment may be any power of two up to 512 (cistern's block alignment); larger alignments
// throw `cistern::InvalidArgument`. Out of memory throws `cistern::OutOfMemory` with cistern's
// message, a bad pointer `cistern::InvalidPointer` (state unchanged). Two adaptors are equal
// when they share the allocator.
#pragma once

#if !defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
// Before CCCL 3.2 the concepts exist only with the macro defined.
#if defined(_CUDA_MEMORY_RESOURCE) && \
    !(defined(CCCL_VERSION) && CCCL_MAJOR_VERSION * 1000 + CCCL_MINOR_VERSION >= 3002)
#error \
    "cistern/cccl_resource.hpp: <cuda/memory_resource> was included before without LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE; include this header first or define the macro for the build"
#endif
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <cstddef>
#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include "cistern/allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/types.hpp"

namespace cistern::cccl {

/// The largest alignment the adaptor accepts: cistern's blocks are 512-byte aligned.
inline constexpr std::size_t max_alignment = 512;

/// A CCCL memory resource over a cistern allocator, which must outlive it: CCCL 3.0's
/// `cuda::mr::resource` and `cuda::mr::async_resource`, CCCL 3.1's
/// `cuda::mr::synchronous_resource` and `cuda::mr::resource`. Cheap to copy (a reference). See
/// the file comment.
class memory_resource {
 public:
  /// An adaptor over `allocator`.
  explicit memory_resource(Allocator& allocator) noexcept : allocator_(&allocator) {}

  /// `bytes` on the legacy default stream.
  void* allocate(std::size_t bytes,
                 std::size_t alignment = ::cuda::mr::default_cuda_malloc_alignment) {
    check_alignment(alignment);
    return allocator_->allocate(bytes, default_stream);
  }
  /// Frees memory from `allocate` (or `allocate_async`) on the legacy default stream.
  void deallocate(void* ptr, std::size_t bytes,
                  std::size_t alignment = ::cuda::mr::default_cuda_malloc_alignment) {
    (void)bytes;
    (void)alignment;
    allocator_->deallocate(ptr, default_stream);
  }
  /// `bytes` for use on `stream`.
  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    check_alignment(alignment);
    return allocator_->allocate(bytes, Stream(stream.get()));
  }
  /// `bytes` for use on `stream`, with the default alignment.
  void* allocate_async(std::size_t bytes, ::cuda::stream_ref stream) {
    return allocate_async(bytes, ::cuda::mr::default_cuda_malloc_alignment, stream);
  }
  /// Frees memory, ordered on `stream`.
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment,
                        ::cuda::stream_ref stream) {
    (void)bytes;
    (void)alignment;
    allocator_->deallocate(ptr, Stream(stream.get()));
  }
  /// Frees memory, ordered on `stream`, with the default alignment.
  void deallocate_async(void* ptr, std::size_t bytes, ::cuda::stream_ref stream) {
    deallocate_async(ptr, bytes, ::cuda::mr::default_cuda_malloc_alignment, stream);
  }

  /// `bytes` for use on `stream` (CCCL 3.1's stream-ordered `allocate`).
  void* allocate(::cuda::stream_ref stream, std::size_t bytes,
                 std::size_t alignment = ::cuda::mr::default_cuda_malloc_alignment) {
    return allocate_async(bytes, alignment, stream);
  }
  /// Frees memory, ordered on `stream` (CCCL 3.1's stream-ordered `deallocate`).
  void deallocate(::cuda::stream_ref stream, void* ptr, std::size_t bytes,
                  std::size_t alignment = ::cuda::mr::default_cuda_malloc_alignment) {
    deallocate_async(ptr, bytes, alignment, stream);
  }
  /// `bytes` on the legacy default stream (CCCL 3.1's `allocate_sync`).
  void* allocate_sync(std::size_t bytes,
                      std::size_t alignment = ::cuda::mr::default_cuda_malloc_alignment) {
    return allocate(bytes, alignment);
  }
  /// Frees memory on the legacy default stream (CCCL 3.1's `deallocate_sync`).
  void deallocate_sync(void* ptr, std::size_t bytes,
                       std::size_t alignment = ::cuda::mr::default_cuda_malloc_alignment) {
    deallocate(ptr, bytes, alignment);
  }

  /// The allocator behind the adaptor.
  Allocator& allocator() const noexcept { return *allocator_; }

  friend bool operator==(const memory_resource& a, const memory_resource& b) noexcept {
    return a.allocator_ == b.allocator_;
  }
  friend bool operator!=(const memory_resource& a, const memory_resource& b) noexcept {
    return !(a == b);
  }
  /// The memory is device memory.
  friend void get_property(const memory_resource&, ::cuda::mr::device_accessible) noexcept {}

 private:
  static void check_alignment(std::size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > max_alignment) {
      throw InvalidArgument("cistern::cccl::memory_resource: alignment " +
                            std::to_string(alignment) +
                            " is not a power of two up to 512 (cistern's block alignment)");
    }
  }

  Allocator* allocator_;
};

}  // namespace cistern::cccl
