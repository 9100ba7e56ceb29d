// NumPy .npy files for the tools and tests: read (format 1.0-3.0, C order,
// little-endian u1, i4, i8, f4) and write (f4, i4). Anything else is rejected with a
// message naming the file; a truncated or malformed file never reads out of bounds.
#ifndef KILN_SUPPORT_NPY_H_
#define KILN_SUPPORT_NPY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::npy {

struct Array {
  std::string dtype;          // "u1", "i4", "i8" or "f4"
  std::vector<size_t> shape;  // empty for a scalar
  std::vector<uint8_t> bytes; // raw little-endian data, C order

  size_t count() const;
  std::vector<float> AsFloat() const;      // f4 only
  std::vector<int64_t> AsInt() const;      // u1, i4, i8
};

// Reads `path`; false and *error on failure.
bool Read(const std::string& path, Array* out, std::string* error);

// Writes float32 or int32 data of `shape`; false and *error on failure.
bool WriteF32(const std::string& path, const float* data, const std::vector<size_t>& shape, std::string* error);
bool WriteI32(const std::string& path, const int32_t* data, const std::vector<size_t>& shape, std::string* error);

}  // namespace kiln::npy

#endif  // KILN_SUPPORT_NPY_H_
