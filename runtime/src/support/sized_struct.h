// Output structs of the C API that start with struct_size (kiln_model_info_t,
// kiln_stats_t): the caller sets the size it was built with, the runtime writes the
// fields that fit and sets struct_size to the bytes written.
#ifndef KILN_RUNTIME_SUPPORT_SIZED_STRUCT_H_
#define KILN_RUNTIME_SUPPORT_SIZED_STRUCT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kiln::rt {

// False (nothing written) when out is null or its struct_size is unset or implausible.
template <typename T>
bool CopySizedOut(const T& from, T* out) {
  if (out == nullptr || out->struct_size < sizeof(uint32_t) || out->struct_size > 4096) return false;
  const size_t n = std::min<size_t>(out->struct_size, sizeof(T));
  T copy = from;
  copy.struct_size = static_cast<uint32_t>(n);
  std::memcpy(out, &copy, n);
  return true;
}

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SUPPORT_SIZED_STRUCT_H_
