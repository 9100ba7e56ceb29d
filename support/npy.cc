#include "support/npy.h"

#include <cstdio>
#include <cstring>

namespace kiln::npy {
namespace {

bool Fail(std::string* error, const std::string& path, const std::string& what) {
  if (error != nullptr) *error = path + ": " + what;
  return false;
}

// The text after 'key': in the header dict, up to the closing quote or paren.
std::string Value(const std::string& header, const std::string& key) {
  size_t p = header.find("'" + key + "'");
  if (p == std::string::npos) return "";
  p = header.find(':', p);
  if (p == std::string::npos) return "";
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p >= header.size()) return "";
  char open = header[p];
  char close = open == '(' ? ')' : open == '\'' ? '\'' : ',';
  size_t end = header.find(close, p + 1);
  if (end == std::string::npos) return "";
  return open == '\'' ? header.substr(p + 1, end - p - 1) : header.substr(p, end - p + (open == '(' ? 1 : 0));
}

bool Write(const std::string& path, const char* descr, const void* data, size_t elem, const std::vector<size_t>& shape,
           std::string* error) {
  std::string dims;
  size_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= shape[i];
  }
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Fail(error, path, "cannot create");
  uint16_t len = static_cast<uint16_t>(header.size());
  unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(len & 0xff),
                             static_cast<unsigned char>(len >> 8)};
  bool ok = std::fwrite(magic, 1, 10, f) == 10 && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (n == 0 || std::fwrite(data, elem, n, f) == n);
  ok = (std::fclose(f) == 0) && ok;
  return ok ? true : Fail(error, path, "write failed");
}

}  // namespace

size_t Array::count() const {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  return n;
}

std::vector<float> Array::AsFloat() const {
  std::vector<float> out(count());
  if (dtype == "f4" && !out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::vector<int64_t> Array::AsInt() const {
  std::vector<int64_t> out(count());
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == "u1") {
      out[i] = bytes[i];
    } else if (dtype == "i4") {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      out[i] = v;
    } else if (dtype == "i8") {
      std::memcpy(&out[i], bytes.data() + 8 * i, 8);
    }
  }
  return out;
}

bool Read(const std::string& path, Array* out, std::string* error) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Fail(error, path, "cannot open");
  std::vector<uint8_t> file;
  uint8_t buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) file.insert(file.end(), buf, buf + n);
  std::fclose(f);
  if (file.size() < 10 || std::memcmp(file.data(), "\x93NUMPY", 6) != 0) return Fail(error, path, "not a .npy file");
  size_t header_len, header_start;
  if (file[6] == 1) {
    header_len = file[8] | (file[9] << 8);
    header_start = 10;
  } else if (file[6] == 2 || file[6] == 3) {
    if (file.size() < 12) return Fail(error, path, "truncated header");
    header_len = file[8] | (file[9] << 8) | (static_cast<size_t>(file[10]) << 16) | (static_cast<size_t>(file[11]) << 24);
    header_start = 12;
  } else {
    return Fail(error, path, "unsupported .npy version");
  }
  if (header_len > file.size() - header_start) return Fail(error, path, "truncated header");
  std::string header(reinterpret_cast<const char*>(file.data() + header_start), header_len);
  std::string descr = Value(header, "descr");
  if (Value(header, "fortran_order").find("True") != std::string::npos)
    return Fail(error, path, "Fortran-order arrays are not supported");
  size_t elem;
  if (descr == "|u1" || descr == "u1") {
    out->dtype = "u1";
    elem = 1;
  } else if (descr == "<i4") {
    out->dtype = "i4";
    elem = 4;
  } else if (descr == "<i8") {
    out->dtype = "i8";
    elem = 8;
  } else if (descr == "<f4") {
    out->dtype = "f4";
    elem = 4;
  } else {
    return Fail(error, path, "unsupported dtype '" + descr + "' (u1, <i4, <i8, <f4)");
  }
  std::string shape = Value(header, "shape");
  if (shape.empty() || shape.front() != '(') return Fail(error, path, "malformed shape");
  out->shape.clear();
  size_t count = 1;
  for (size_t p = 1; p < shape.size();) {
    while (p < shape.size() && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p >= shape.size() || shape[p] == ')') break;
    size_t v = 0, digits = 0;
    while (p < shape.size() && shape[p] >= '0' && shape[p] <= '9') {
      if (v > (SIZE_MAX - 9) / 10) return Fail(error, path, "shape overflows");
      v = v * 10 + static_cast<size_t>(shape[p++] - '0');
      ++digits;
    }
    if (digits == 0) return Fail(error, path, "malformed shape");
    if (v != 0 && count > SIZE_MAX / v) return Fail(error, path, "shape overflows");
    count *= v;
    out->shape.push_back(v);
  }
  size_t data_start = header_start + header_len;
  if (count > (file.size() - data_start) / elem) return Fail(error, path, "data shorter than the shape");
  out->bytes.assign(file.begin() + static_cast<long>(data_start),
                    file.begin() + static_cast<long>(data_start + count * elem));
  return true;
}

bool WriteF32(const std::string& path, const float* data, const std::vector<size_t>& shape, std::string* error) {
  return Write(path, "<f4", data, 4, shape, error);
}

bool WriteI32(const std::string& path, const int32_t* data, const std::vector<size_t>& shape, std::string* error) {
  return Write(path, "<i4", data, 4, shape, error);
}

}  // namespace kiln::npy
