// Allocation through the caller's kiln_allocator_t, with byte accounting.
#ifndef KILN_RUNTIME_SUPPORT_ALLOCATOR_H_
#define KILN_RUNTIME_SUPPORT_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kiln/kiln.h"

namespace kiln::rt {

// Wraps a kiln_allocator_t (or malloc/free when none is given) and keeps the number
// of bytes currently allocated and its high-water mark. Thread-safe.
class Allocator {
 public:
  explicit Allocator(const kiln_allocator_t* allocator = nullptr);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns `size` bytes aligned to `alignment` (power of two, <= 4096), or nullptr.
  void* Alloc(size_t size, size_t alignment = 64);
  void Free(void* ptr);

  // Typed helpers for arrays of trivially constructible T.
  template <typename T>
  T* AllocArray(size_t count, size_t alignment = alignof(T) < 16 ? 16 : alignof(T)) {
    if (count > SIZE_MAX / sizeof(T)) return nullptr;
    return static_cast<T*>(Alloc(count * sizeof(T), alignment));
  }

  uint64_t current_bytes() const { return current_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  void ResetPeak() { peak_.store(current_bytes(), std::memory_order_relaxed); }
  const kiln_allocator_t& raw() const { return allocator_; }

 private:
  kiln_allocator_t allocator_;
  std::atomic<uint64_t> current_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SUPPORT_ALLOCATOR_H_
