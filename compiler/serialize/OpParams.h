//===- OpParams.h - op parameters into the artifact --------------*- C++ -*-===//
//
// Serialises a dialect op's parameters into the kiln.fbs parameter table that
// formats/ops.def names for its kind, generically: each field of the table (read
// from the schema's mini-reflection) takes the op's attribute of the same name.
// Adding an op or a parameter needs no code here.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_SERIALIZE_OPPARAMS_H
#define KILN_COMPILER_SERIALIZE_OPPARAMS_H

#include "formats/kiln_generated.h"
#include "mlir/IR/Operation.h"

namespace kiln {

struct SerializedParams {
  fb::OpParams type = fb::OpParams::NONE;
  flatbuffers::Offset<void> table;
};

/// The parameters of `op` (artifact kind `kind`); errors are emitted on the op.
mlir::FailureOr<SerializedParams> serializeOpParams(flatbuffers::FlatBufferBuilder& b, mlir::Operation* op,
                                                    fb::OpKind kind);

} // namespace kiln

#endif // KILN_COMPILER_SERIALIZE_OPPARAMS_H
