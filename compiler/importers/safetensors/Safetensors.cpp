//===- Safetensors.cpp - safetensors header reader ---------------*- C++ -*-===//
#include "compiler/importers/safetensors/Safetensors.h"

#include <algorithm>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

namespace kiln::safetensors {

namespace {

// Safetensors' own limit for the header (the Rust implementation uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

llvm::Error fail(llvm::StringRef file, const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 (file + ": " + message).str());
}

struct DTypeEntry {
  DType dtype;
  const char* name;
  unsigned bytes;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::F64, "F64", 8},   {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8},         {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},   {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

// llvm::json keeps the last of duplicate keys silently; safetensors forbids them.
// Scans the top level of a JSON object for repeated keys (the header is small).
std::optional<std::string> findDuplicateTopLevelKey(llvm::StringRef json) {
  llvm::StringSet<> seen;
  int depth = 0;
  bool expectKey = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (c == '"') {
      size_t j = i + 1;
      std::string s;
      while (j < json.size() && json[j] != '"') {
        if (json[j] == '\\' && j + 1 < json.size()) {
          s += json[j];
          ++j;
        }
        s += json[j];
        ++j;
      }
      if (depth == 1 && expectKey) {
        if (!seen.insert(s).second)
          return s;
        expectKey = false;
      }
      i = j;
    } else if (c == '{' || c == '[') {
      ++depth;
      if (depth == 1 && c == '{')
        expectKey = true;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 1) {
      expectKey = true;
    }
  }
  return std::nullopt;
}

bool readFully(int fd, void* buf, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

} // namespace

llvm::StringRef dtypeName(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype)
      return e.name;
  return "?";
}

unsigned dtypeBytes(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype)
      return e.bytes;
  return 0;
}

std::optional<DType> parseDType(llvm::StringRef name) {
  for (const auto& e : kDTypes)
    if (name == e.name)
      return e.dtype;
  return std::nullopt;
}

uint64_t TensorInfo::numElements() const {
  uint64_t n = 1;
  for (int64_t d : shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

llvm::Expected<FileHeader> parseHeader(llvm::StringRef json, uint64_t dataStart,
                                       uint64_t dataSize, llvm::StringRef displayName) {
  FileHeader header;
  header.dataStart = dataStart;
  header.fileSize = dataStart + dataSize;

  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(json);
  if (!parsed)
    return fail(displayName, "header is not valid JSON: " + llvm::toString(parsed.takeError()));
  const llvm::json::Object* root = parsed->getAsObject();
  if (!root)
    return fail(displayName, "header is not a JSON object");
  if (auto dup = findDuplicateTopLevelKey(json))
    return fail(displayName, "tensor '" + *dup + "' appears twice in the header");

  for (const auto& [key, value] : *root) {
    llvm::StringRef name = key;
    if (name == "__metadata__") {
      const llvm::json::Object* meta = value.getAsObject();
      if (!meta)
        return fail(displayName, "__metadata__ is not an object");
      for (const auto& [mk, mv] : *meta) {
        auto s = mv.getAsString();
        if (!s)
          return fail(displayName, "__metadata__ value '" + llvm::StringRef(mk) +
                                       "' is not a string");
        header.metadata[mk.str()] = s->str();
      }
      continue;
    }
    const llvm::json::Object* entry = value.getAsObject();
    if (!entry)
      return fail(displayName, "tensor '" + name + "': entry is not an object");
    TensorInfo info;
    info.name = name.str();
    info.file = displayName.str();

    auto dtypeStr = entry->getString("dtype");
    if (!dtypeStr)
      return fail(displayName, "tensor '" + name + "': missing dtype");
    auto dtype = parseDType(*dtypeStr);
    if (!dtype)
      return fail(displayName, "tensor '" + name + "': unknown dtype '" + *dtypeStr + "'");
    info.dtype = *dtype;

    const llvm::json::Array* shape = entry->getArray("shape");
    if (!shape)
      return fail(displayName, "tensor '" + name + "': missing shape");
    uint64_t bytes = dtypeBytes(info.dtype);
    for (const llvm::json::Value& d : *shape) {
      auto dim = d.getAsInteger();
      if (!dim || *dim < 0)
        return fail(displayName, "tensor '" + name + "': shape entries must be non-negative integers");
      info.shape.push_back(*dim);
      uint64_t u = static_cast<uint64_t>(*dim);
      if (u != 0 && bytes > UINT64_MAX / u)
        return fail(displayName, "tensor '" + name + "': shape x dtype size overflows");
      bytes *= u;
    }

    const llvm::json::Array* offsets = entry->getArray("data_offsets");
    if (!offsets || offsets->size() != 2)
      return fail(displayName, "tensor '" + name + "': data_offsets must be [begin, end]");
    auto begin = (*offsets)[0].getAsInteger(), end = (*offsets)[1].getAsInteger();
    if (!begin || !end || *begin < 0 || *end < 0)
      return fail(displayName, "tensor '" + name + "': data_offsets must be non-negative integers");
    uint64_t b = static_cast<uint64_t>(*begin), e = static_cast<uint64_t>(*end);
    if (b > e)
      return fail(displayName, "tensor '" + name + "': data_offsets begin " + llvm::Twine(b) +
                                   " is after end " + llvm::Twine(e));
    if (e > dataSize)
      return fail(displayName, "tensor '" + name + "': data [" + llvm::Twine(b) + ", " +
                                   llvm::Twine(e) + ") lies outside the file's " +
                                   llvm::Twine(dataSize) + " data bytes (truncated file?)");
    if (e - b != bytes)
      return fail(displayName, "tensor '" + name + "': " + llvm::Twine(e - b) +
                                   " data bytes do not match shape x dtype (" +
                                   llvm::Twine(bytes) + " bytes)");
    info.dataOffset = dataStart + b;
    info.size = bytes;
    header.tensors.push_back(std::move(info));
  }

  // As the reference implementation: tensors must tile the data area without
  // overlaps or holes.
  std::vector<const TensorInfo*> sorted;
  for (const TensorInfo& t : header.tensors)
    sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->dataOffset != b->dataOffset ? a->dataOffset < b->dataOffset : a->size < b->size;
  });
  uint64_t expected = dataStart;
  for (const TensorInfo* t : sorted) {
    if (t->dataOffset < expected)
      return fail(displayName, "tensor '" + t->name + "' overlaps the previous tensor's data");
    if (t->dataOffset > expected)
      return fail(displayName, "tensor '" + t->name + "' leaves a hole of " +
                                   llvm::Twine(t->dataOffset - expected) +
                                   " bytes before its data");
    expected = t->dataOffset + t->size;
  }
  if (expected != header.fileSize)
    return fail(displayName, llvm::Twine(header.fileSize - expected) +
                                 " trailing bytes after the last tensor's data");
  return header;
}

llvm::Expected<FileHeader> readHeader(llvm::StringRef path, llvm::StringRef displayName) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; anything but a regular
  // file (after symlinks, which the Hugging Face cache uses) is refused below.
  int fd = ::open(path.str().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return fail(displayName, "cannot open: " + llvm::Twine(std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0)
    return fail(displayName, "cannot stat: " + llvm::Twine(std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    return fail(displayName, "not a regular file");
  uint64_t fileSize = static_cast<uint64_t>(st.st_size);
  if (fileSize < 8)
    return fail(displayName, "file of " + llvm::Twine(fileSize) +
                                 " bytes is too short for a safetensors header");
  unsigned char lenBytes[8];
  if (!readFully(fd, lenBytes, 8, 0))
    return fail(displayName, "cannot read the header length");
  uint64_t headerLen = 0;
  for (int i = 7; i >= 0; --i)
    headerLen = (headerLen << 8) | lenBytes[i];
  if (headerLen > kMaxHeaderBytes)
    return fail(displayName, "header length " + llvm::Twine(headerLen) +
                                 " exceeds the 100 MB limit (corrupt header?)");
  if (headerLen > fileSize - 8)
    return fail(displayName, "header length " + llvm::Twine(headerLen) + " exceeds the file size " +
                                 llvm::Twine(fileSize) + " (truncated file?)");
  std::string json(headerLen, '\0');
  if (!readFully(fd, json.data(), headerLen, 8))
    return fail(displayName, "cannot read the header");
  // The format pads the header with spaces; JSON parsers accept trailing spaces.
  auto header = parseHeader(json, 8 + headerLen, fileSize - 8 - headerLen, displayName);
  if (header)
    header->path = path.str();
  return header;
}

llvm::Expected<Checkpoint> openCheckpoint(llvm::StringRef directory) {
  Checkpoint ckpt;
  ckpt.directory = directory.str();
  if (!llvm::sys::fs::is_directory(directory))
    return fail(directory, "not a directory");

  auto addFile = [&](llvm::StringRef name) -> llvm::Error {
    llvm::SmallString<256> path(directory);
    llvm::sys::path::append(path, name);
    auto header = readHeader(path, name);
    if (!header)
      return header.takeError();
    for (const TensorInfo& t : header->tensors) {
      if (!ckpt.tensors.emplace(t.name, t).second)
        return fail(name, "tensor '" + t.name + "' also appears in " +
                              ckpt.tensors.at(t.name).file);
      ckpt.totalBytes += t.size;
    }
    ckpt.files.push_back(std::move(*header));
    return llvm::Error::success();
  };

  llvm::SmallString<256> indexPath(directory);
  llvm::sys::path::append(indexPath, "model.safetensors.index.json");
  if (llvm::sys::fs::exists(indexPath)) {
    constexpr llvm::StringLiteral kIndex = "model.safetensors.index.json";
    if (!llvm::sys::fs::is_regular_file(indexPath))
      return fail(kIndex, "not a regular file");
    auto buffer = llvm::MemoryBuffer::getFile(indexPath);
    if (!buffer)
      return fail(kIndex, "cannot read: " + buffer.getError().message());
    auto parsed = llvm::json::parse((*buffer)->getBuffer());
    if (!parsed)
      return fail(kIndex, "not valid JSON: " + llvm::toString(parsed.takeError()));
    const llvm::json::Object* root = parsed->getAsObject();
    const llvm::json::Object* weightMap = root ? root->getObject("weight_map") : nullptr;
    if (!weightMap)
      return fail(kIndex, "missing the weight_map object");
    std::vector<std::string> shards;
    std::map<std::string, std::string> expected;
    for (const auto& [tensor, fileValue] : *weightMap) {
      auto file = fileValue.getAsString();
      if (!file)
        return fail(kIndex, "weight_map entry '" + llvm::StringRef(tensor) + "' is not a string");
      if (file->contains('/') || file->contains('\\') || *file == ".." || file->empty())
        return fail(kIndex, "weight_map entry '" + llvm::StringRef(tensor) +
                                "' names a file outside the checkpoint directory: " + *file);
      expected[tensor.str()] = file->str();
      if (std::find(shards.begin(), shards.end(), file->str()) == shards.end())
        shards.push_back(file->str());
    }
    std::sort(shards.begin(), shards.end());
    for (const std::string& shard : shards)
      if (llvm::Error err = addFile(shard))
        return std::move(err);
    for (const auto& [tensor, file] : expected) {
      auto it = ckpt.tensors.find(tensor);
      if (it == ckpt.tensors.end())
        return fail(kIndex, "tensor '" + tensor + "' is listed in " + file +
                                " but that file does not contain it");
      if (it->second.file != file)
        return fail(kIndex, "tensor '" + tensor + "' is listed in " + file + " but found in " +
                                it->second.file);
    }
    for (const auto& [tensor, info] : ckpt.tensors)
      if (!expected.count(tensor))
        return fail(kIndex, "tensor '" + tensor + "' in " + info.file +
                                " is missing from the weight_map");
    return ckpt;
  }

  // No index: exactly one *.safetensors file.
  std::vector<std::string> found;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(directory, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (name.ends_with(".safetensors"))
      found.push_back(name.str());
  }
  if (ec)
    return fail(directory, "cannot list: " + ec.message());
  if (found.empty())
    return fail(directory, "no *.safetensors file and no model.safetensors.index.json");
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    return fail(directory, "several .safetensors files (" + llvm::join(found, ", ") +
                               ") but no model.safetensors.index.json to tie them together");
  }
  if (llvm::Error err = addFile(found.front()))
    return std::move(err);
  return ckpt;
}

} // namespace kiln::safetensors
