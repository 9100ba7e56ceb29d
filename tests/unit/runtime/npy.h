// A minimal reader of NumPy .npy files for tests: format versions 1.0-3.0, C order,
// little-endian uint8 ('|u1') and float32 ('<f4') arrays. Anything else is rejected with a
// message; a truncated or malformed file never reads out of bounds.
#ifndef KILN_TESTS_UNIT_RUNTIME_NPY_H_
#define KILN_TESTS_UNIT_RUNTIME_NPY_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::test {

struct NpyArray {
  std::string dtype;           // "u1" or "f4"
  std::vector<size_t> shape;   // empty for a scalar
  std::vector<uint8_t> bytes;  // raw little-endian data, C order

  size_t count() const {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    return n;
  }
  const uint8_t* u8() const { return bytes.data(); }
  std::vector<float> f32() const {
    std::vector<float> out(bytes.size() / 4);
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);  // host is LE
    return out;
  }
};

namespace npy_detail {

inline bool Fail(std::string* error, const std::string& path, const std::string& what) {
  if (error != nullptr) *error = path + ": " + what;
  return false;
}

// The value text of 'key' in the header dict ("'descr': '<f4', ..."), or "" if absent.
inline std::string DictValue(const std::string& header, const std::string& key) {
  const std::string quoted = "'" + key + "'";
  size_t p = header.find(quoted);
  if (p == std::string::npos) return "";
  p = header.find(':', p + quoted.size());
  if (p == std::string::npos) return "";
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p >= header.size()) return "";
  if (header[p] == '(') {
    const size_t end = header.find(')', p);
    return end == std::string::npos ? "" : header.substr(p, end - p + 1);
  }
  if (header[p] == '\'') {
    const size_t end = header.find('\'', p + 1);
    return end == std::string::npos ? "" : header.substr(p + 1, end - p - 1);
  }
  size_t end = p;
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(p, end - p);
}

}  // namespace npy_detail

// Reads `path` into *out. Returns false with *error set on any problem.
inline bool ReadNpy(const std::string& path, NpyArray* out, std::string* error) {
  using npy_detail::Fail;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Fail(error, path, "cannot open");
  std::vector<uint8_t> file;
  uint8_t buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) file.insert(file.end(), buf, buf + got);
  const bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error) return Fail(error, path, "read error");

  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (file.size() < 10 || std::memcmp(file.data(), kMagic, 6) != 0) {
    return Fail(error, path, "not an .npy file (bad magic)");
  }
  const uint8_t major = file[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = file[8] | (size_t{file[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (file.size() < 12) return Fail(error, path, "truncated header length");
    header_len =
        file[8] | (size_t{file[9]} << 8) | (size_t{file[10]} << 16) | (size_t{file[11]} << 24);
    header_start = 12;
  } else {
    return Fail(error, path, "unsupported .npy version " + std::to_string(major));
  }
  if (header_len > file.size() - header_start) return Fail(error, path, "truncated header");
  const std::string header(reinterpret_cast<const char*>(file.data() + header_start), header_len);

  const std::string descr = npy_detail::DictValue(header, "descr");
  if (descr == "|u1" || descr == "<u1" || descr == "u1") {
    out->dtype = "u1";
  } else if (descr == "<f4") {
    out->dtype = "f4";
  } else {
    return Fail(error, path, "unsupported dtype '" + descr + "' (need |u1 or <f4)");
  }
  const std::string fortran = npy_detail::DictValue(header, "fortran_order");
  if (fortran != "False") return Fail(error, path, "fortran_order must be False");
  const std::string shape = npy_detail::DictValue(header, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
    return Fail(error, path, "malformed shape '" + shape + "'");
  }
  out->shape.clear();
  size_t count = 1;
  for (size_t i = 1; i + 1 < shape.size();) {
    while (i + 1 < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i + 1 >= shape.size()) break;
    size_t value = 0, digits = 0;
    while (i + 1 < shape.size() && shape[i] >= '0' && shape[i] <= '9') {
      if (value > (SIZE_MAX - 9) / 10) return Fail(error, path, "shape overflows");
      value = value * 10 + static_cast<size_t>(shape[i] - '0');
      ++i;
      ++digits;
    }
    if (digits == 0) return Fail(error, path, "malformed shape '" + shape + "'");
    if (value != 0 && count > SIZE_MAX / value) return Fail(error, path, "shape overflows");
    count *= value;
    out->shape.push_back(value);
  }
  const size_t item = out->dtype == "f4" ? 4 : 1;
  if (count > SIZE_MAX / item) return Fail(error, path, "shape overflows");
  const size_t data_start = header_start + header_len;
  if (file.size() - data_start != count * item) {
    return Fail(error, path,
                "data is " + std::to_string(file.size() - data_start) + " bytes, shape needs " +
                    std::to_string(count * item));
  }
  out->bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(data_start), file.end());
  return true;
}

}  // namespace kiln::test

#endif  // KILN_TESTS_UNIT_RUNTIME_NPY_H_
