// A growable array whose memory comes from an Allocator and whose growth can fail
// (returns false) instead of throwing: the runtime is built without exceptions.
#ifndef KILN_RUNTIME_SUPPORT_VEC_H_
#define KILN_RUNTIME_SUPPORT_VEC_H_

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "support/allocator.h"

namespace kiln::rt {

// The storage of every Vec<T>, its growth out of line once for all element types
// (sizes and alignments are arguments): each Vec<T> adds inline wrappers only.
class VecStorage {
 public:
  explicit VecStorage(Allocator* allocator = nullptr) : allocator_(allocator) {}
  ~VecStorage() { Release(); }
  VecStorage(const VecStorage&) = delete;
  VecStorage& operator=(const VecStorage&) = delete;
  VecStorage(VecStorage&& other) noexcept { *this = std::move(other); }
  VecStorage& operator=(VecStorage&& other) noexcept;

 protected:
  // Capacity for at least n elements of `size` bytes aligned to `align`.
  bool Reserve(size_t n, size_t size, size_t align);
  // n elements, the new ones zero-filled.
  bool Resize(size_t n, size_t size, size_t align);
  // Room for one more element (capacity doubled, at least 8).
  bool Grow(size_t size, size_t align);
  // n elements of `size` bytes from `values` appended.
  bool Append(const void* values, size_t n, size_t size, size_t align);
  void Release();

  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

template <typename T>
class Vec : private VecStorage {
  static_assert(std::is_trivially_copyable<T>::value, "Vec holds trivially copyable values");
  static constexpr size_t kAlign = alignof(T) < 16 ? 16 : alignof(T);

 public:
  explicit Vec(Allocator* allocator = nullptr) : VecStorage(allocator) {}
  Vec(Vec&& other) noexcept = default;
  Vec& operator=(Vec&& other) noexcept = default;

  void set_allocator(Allocator* allocator) {
    Release();
    allocator_ = allocator;
  }

  [[nodiscard]] bool reserve(size_t n) { return n <= capacity_ || Reserve(n, sizeof(T), kAlign); }
  // New elements are zero-filled.
  [[nodiscard]] bool resize(size_t n) { return Resize(n, sizeof(T), kAlign); }
  [[nodiscard]] bool push_back(const T& value) {
    if (size_ == capacity_ && !Grow(sizeof(T), kAlign)) return false;
    data()[size_++] = value;
    return true;
  }
  [[nodiscard]] bool append(const T* values, size_t n) { return Append(values, n, sizeof(T), kAlign); }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }

  T* data() { return static_cast<T*>(data_); }
  const T* data() const { return static_cast<const T*>(data_); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SUPPORT_VEC_H_
