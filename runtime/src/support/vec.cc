#include "support/vec.h"

#include <cstdint>

namespace kiln::rt {

VecStorage& VecStorage::operator=(VecStorage&& other) noexcept {
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

bool VecStorage::Reserve(size_t n, size_t size, size_t align) {
  if (n <= capacity_) return true;
  if (allocator_ == nullptr || n > SIZE_MAX / size) return false;
  void* fresh = allocator_->Alloc(n * size, align);
  if (fresh == nullptr) return false;
  if (size_ > 0) std::memcpy(fresh, data_, size_ * size);
  allocator_->Free(data_);
  data_ = fresh;
  capacity_ = n;
  return true;
}

bool VecStorage::Resize(size_t n, size_t size, size_t align) {
  if (n > capacity_ && !Reserve(n, size, align)) return false;
  if (n > size_) std::memset(static_cast<char*>(data_) + size_ * size, 0, (n - size_) * size);
  size_ = n;
  return true;
}

bool VecStorage::Grow(size_t size, size_t align) {
  return Reserve(capacity_ < 8 ? 8 : capacity_ * 2, size, align);
}

bool VecStorage::Append(const void* values, size_t n, size_t size, size_t align) {
  if (n == 0) return true;
  if (size_ + n > capacity_ && !Reserve(size_ + n > capacity_ * 2 ? size_ + n : capacity_ * 2, size, align))
    return false;
  std::memcpy(static_cast<char*>(data_) + size_ * size, values, n * size);
  size_ += n;
  return true;
}

void VecStorage::Release() {
  if (allocator_ != nullptr) allocator_->Free(data_);
  data_ = nullptr;
  size_ = capacity_ = 0;
}

}  // namespace kiln::rt
