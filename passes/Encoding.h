//===- Encoding.h - the dialect's encodings as the artifact's ----*- C++ -*-===//
//
// The one conversion from the kiln dialect's #kiln.encoding to the storage
// encoding of the artifact contract (formats/encoding.h), and the compile-time
// proof that the dialect's EncodingKind enum has the ids of formats/encodings.def.
// Everything in the compiler that needs sizes or byte layouts goes through here.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_ENCODING_H
#define KILN_PASSES_ENCODING_H

#include <cstdint>

#include "dialects/kiln/KilnAttrs.h"
#include "formats/encoding.h"
#include "formats/kv_codec.h"

namespace kiln {

#define KILN_ENCODING(name, id, label, bits, quantized)                                   \
  static_assert(static_cast<uint8_t>(EncodingKind::label) == id,                           \
                "KilnAttrs.td EncodingKind and formats/encodings.def disagree on " #label);
#include "formats/encodings.def"
#undef KILN_ENCODING

/// The artifact's description of an encoding attribute.
inline format::EncodingSpec encodingSpec(EncodingAttr e) {
  format::EncodingSpec s;
  s.id = static_cast<uint8_t>(e.getKind());
  s.group = static_cast<uint32_t>(e.getGroupSize());
  s.symmetric = e.getSymmetric();
  return s;
}

/// Bytes a [rows, cols] weight takes in encoding `e` (0: it cannot hold that shape).
inline uint64_t storageBytes(EncodingAttr e, uint64_t rows, uint64_t cols) {
  return format::StorageBytes(encodingSpec(e), rows, cols);
}

/// The KV cache a label names ("f32", "f16", "int8", "int4") for heads of `headDim`
/// channels, with the group formats/kv_codec.h picks; null for any other label.
inline KvCacheAttr kvCacheEncoding(mlir::MLIRContext* context, llvm::StringRef label, int64_t headDim) {
  for (EncodingKind kind : {EncodingKind::f32, EncodingKind::f16, EncodingKind::int8, EncodingKind::int4})
    if (label == stringifyEncodingKind(kind))
      return KvCacheAttr::get(context, kind,
                              format::KvDefaultGroup(static_cast<uint8_t>(kind), static_cast<uint32_t>(headDim)));
  return {};
}

} // namespace kiln

#endif // KILN_PASSES_ENCODING_H
