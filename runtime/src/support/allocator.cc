#include "support/allocator.h"

#include <cstdlib>
#include <cstring>

namespace kiln::rt {
namespace {

void* DefaultAlloc(void*, size_t size, size_t alignment) {
  void* p = nullptr;
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  if (posix_memalign(&p, alignment, size == 0 ? 1 : size) != 0) return nullptr;
  return p;
}

void DefaultFree(void*, void* ptr) { std::free(ptr); }

// Every block carries its size in a header just before the returned pointer, so that
// Free can account for it without the caller passing the size back.
struct Header {
  uint64_t size;
  uint64_t offset;  // from the start of the underlying block to the user pointer
};

}  // namespace

Allocator::Allocator(const kiln_allocator_t* allocator) {
  if (allocator != nullptr && allocator->alloc != nullptr && allocator->free != nullptr) {
    allocator_ = *allocator;
  } else {
    allocator_.alloc = DefaultAlloc;
    allocator_.free = DefaultFree;
    allocator_.user = nullptr;
  }
}

void* Allocator::Alloc(size_t size, size_t alignment) {
  if (alignment < 16) alignment = 16;
  if (alignment > 4096 || (alignment & (alignment - 1)) != 0) return nullptr;
  // Room for the header, keeping the user pointer aligned.
  size_t offset = alignment;
  if (size > SIZE_MAX - offset) return nullptr;
  auto* base = static_cast<uint8_t*>(allocator_.alloc(allocator_.user, size + offset, alignment));
  if (base == nullptr) return nullptr;
  uint8_t* user = base + offset;
  Header h{size, offset};
  std::memcpy(user - sizeof(Header), &h, sizeof(Header));
  uint64_t now = current_.fetch_add(size, std::memory_order_relaxed) + size;
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return user;
}

void Allocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  auto* user = static_cast<uint8_t*>(ptr);
  Header h;
  std::memcpy(&h, user - sizeof(Header), sizeof(Header));
  current_.fetch_sub(h.size, std::memory_order_relaxed);
  allocator_.free(allocator_.user, user - h.offset);
}

}  // namespace kiln::rt
