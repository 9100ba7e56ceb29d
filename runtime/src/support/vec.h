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

template <typename T>
class Vec {
  static_assert(std::is_trivially_copyable<T>::value, "Vec holds trivially copyable values");

 public:
  explicit Vec(Allocator* allocator = nullptr) : allocator_(allocator) {}
  ~Vec() { Release(); }
  Vec(const Vec&) = delete;
  Vec& operator=(const Vec&) = delete;
  Vec(Vec&& other) noexcept { *this = std::move(other); }
  Vec& operator=(Vec&& other) noexcept {
    if (this != &other) {
      Release();
      allocator_ = other.allocator_;
      data_ = other.data_;
      size_ = other.size_;
      capacity_ = other.capacity_;
      other.data_ = nullptr;
      other.size_ = other.capacity_ = 0;
    }
    return *this;
  }

  void set_allocator(Allocator* allocator) {
    Release();
    allocator_ = allocator;
  }

  [[nodiscard]] bool reserve(size_t n) {
    if (n <= capacity_) return true;
    if (allocator_ == nullptr) return false;
    T* fresh = allocator_->AllocArray<T>(n);
    if (fresh == nullptr) return false;
    if (size_ > 0) std::memcpy(fresh, data_, size_ * sizeof(T));
    allocator_->Free(data_);
    data_ = fresh;
    capacity_ = n;
    return true;
  }
  // New elements are zero-filled.
  [[nodiscard]] bool resize(size_t n) {
    if (n > capacity_ && !reserve(n)) return false;
    if (n > size_) std::memset(static_cast<void*>(data_ + size_), 0, (n - size_) * sizeof(T));
    size_ = n;
    return true;
  }
  [[nodiscard]] bool push_back(const T& value) {
    if (size_ == capacity_ && !reserve(capacity_ < 8 ? 8 : capacity_ * 2)) return false;
    data_[size_++] = value;
    return true;
  }
  [[nodiscard]] bool append(const T* values, size_t n) {
    if (n == 0) return true;
    if (size_ + n > capacity_ && !reserve(size_ + n > capacity_ * 2 ? size_ + n : capacity_ * 2))
      return false;
    std::memcpy(data_ + size_, values, n * sizeof(T));
    size_ += n;
    return true;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void Release() {
    if (allocator_ != nullptr) allocator_->Free(data_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

  Allocator* allocator_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SUPPORT_VEC_H_
