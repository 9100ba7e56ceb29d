//===- Safetensors.h - safetensors header reader -----------------*- C++ -*-===//
//
// Reads and validates the header of safetensors files (single or sharded through
// model.safetensors.index.json) without touching tensor data: a multi-gigabyte
// checkpoint is described by a few kilobytes of JSON. Every field is validated —
// header size bounds, JSON structure, dtypes, shape x dtype overflow, offsets inside
// the file, overlaps and holes, duplicate names — and errors name the file and the
// tensor.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_IMPORTERS_SAFETENSORS_SAFETENSORS_H
#define KILN_COMPILER_IMPORTERS_SAFETENSORS_SAFETENSORS_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace kiln::safetensors {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

llvm::StringRef dtypeName(DType dtype);
unsigned dtypeBytes(DType dtype);
std::optional<DType> parseDType(llvm::StringRef name);

struct TensorInfo {
  std::string name;
  std::string file;       // file name as given (relative to the checkpoint dir)
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t dataOffset;    // absolute byte offset of the data in the file
  uint64_t size;          // bytes
  uint64_t numElements() const;
};

/// One safetensors file's header.
struct FileHeader {
  std::string path;
  uint64_t fileSize = 0;
  uint64_t dataStart = 0; // 8 + header length
  std::map<std::string, std::string> metadata;
  std::vector<TensorInfo> tensors; // in header order
};

/// Reads and validates the header of `path`. `displayName` is what tensors record
/// as their file (normally the name relative to the checkpoint directory).
llvm::Expected<FileHeader> readHeader(llvm::StringRef path, llvm::StringRef displayName);

/// Parses header JSON already in memory (for tests and fuzzing): `dataSize` is the
/// number of data bytes that follow the header in the file.
llvm::Expected<FileHeader> parseHeader(llvm::StringRef json, uint64_t dataStart,
                                       uint64_t dataSize, llvm::StringRef displayName);

/// All tensors of a checkpoint directory: model.safetensors.index.json when present
/// (every shard it names is read and cross-checked against its weight_map),
/// otherwise the single *.safetensors file.
struct Checkpoint {
  std::string directory;
  std::vector<FileHeader> files;
  std::map<std::string, TensorInfo> tensors;
  uint64_t totalBytes = 0;
};

llvm::Expected<Checkpoint> openCheckpoint(llvm::StringRef directory);

} // namespace kiln::safetensors

#endif // KILN_COMPILER_IMPORTERS_SAFETENSORS_SAFETENSORS_H
