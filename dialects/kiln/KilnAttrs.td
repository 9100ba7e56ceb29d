//===- KilnAttrs.td - kiln dialect attributes --------------*- tablegen -*-===//

#ifndef KILN_DIALECT_KILNATTRS_TD
#define KILN_DIALECT_KILNATTRS_TD

include "dialects/kiln/KilnBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/AttrTypeBase.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Kiln_StageKind : I32EnumAttr<"StageKind", "model stage", [
    I32EnumAttrCase<"vision_encoder", 0>,
    I32EnumAttrCase<"projector", 1>,
    I32EnumAttrCase<"decoder_prefill", 2>,
    I32EnumAttrCase<"decoder_decode", 3>,
    I32EnumAttrCase<"lm_head", 4>]> {
  let cppNamespace = "::kiln";
  let genSpecializedAttr = 0;
}
def Kiln_StageAttr : EnumAttr<Kiln_Dialect, Kiln_StageKind, "stage"> {
  let assemblyFormat = "`<` $value `>`";
}

def Kiln_ActivationKind : I32EnumAttr<"ActivationKind", "activation function", [
    I32EnumAttrCase<"silu", 0>,
    I32EnumAttrCase<"gelu", 1>,             // exact erf GELU
    I32EnumAttrCase<"gelu_tanh", 2>,        // gelu_pytorch_tanh / gelu_new
    I32EnumAttrCase<"quick_gelu", 3>,       // x * sigmoid(1.702 x)
    I32EnumAttrCase<"relu", 4>]> {
  let cppNamespace = "::kiln";
  let genSpecializedAttr = 0;
}
def Kiln_ActivationAttr : EnumAttr<Kiln_Dialect, Kiln_ActivationKind, "activation"> {
  let assemblyFormat = "`<` $value `>`";
}

// Storage of a weight. The numeric formats are defined in docs/precision.md.
def Kiln_EncodingKind : I32EnumAttr<"EncodingKind", "weight storage encoding", [
    I32EnumAttrCase<"f32", 0>,
    I32EnumAttrCase<"f16", 1>,
    I32EnumAttrCase<"bf16", 2>,
    I32EnumAttrCase<"fp8_e4m3", 3>,
    I32EnumAttrCase<"fp8_e5m2", 4>,
    I32EnumAttrCase<"int8", 5>,
    I32EnumAttrCase<"int4", 6>]> {
  let cppNamespace = "::kiln";
}

// How a layer's activations enter its matrix multiply.
def Kiln_ActivationMode : I32EnumAttr<"ActivationMode", "activation precision", [
    I32EnumAttrCase<"Float", 0, "float">,
    I32EnumAttrCase<"Int8PerToken", 1, "int8_per_token">]> {
  let cppNamespace = "::kiln";
}

// How a weight's elements are arranged in the artifact (formats/kiln.fbs Layout).
def Kiln_LayoutKind : I32EnumAttr<"LayoutKind", "weight storage layout", [
    I32EnumAttrCase<"row_major", 0>,
    I32EnumAttrCase<"int4_p4k32", 1>,
    I32EnumAttrCase<"panel16", 2>]> {
  let cppNamespace = "::kiln";
  let genSpecializedAttr = 0;
}
def Kiln_LayoutAttr : EnumAttr<Kiln_Dialect, Kiln_LayoutKind, "layout"> {
  let summary = "Arrangement of a weight's elements in the artifact";
  let description = [{
    `row_major` is the weight's logical shape in row-major order (the default of
    `kiln.weight`). `int4_p4k32` is a symmetric int4 weight packed for the
    generated W4A8 matmuls by `kiln-pack-weights`: rows in panels of 4, columns in
    blocks of 32 whose two halves share bytes as signed nibbles, scales interleaved
    by panel. `panel16` is a float weight (f32, f16, bf16) packed for the
    generated float matmuls: rows in panels of 16, each panel column by column
    (formats/encoding.h gives the bytes of both).

    ```mlir
    #kiln.layout<row_major>
    #kiln.layout<int4_p4k32>
    #kiln.layout<panel16>
    ```
  }];
  let assemblyFormat = "`<` $value `>`";
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

//===----------------------------------------------------------------------===//
// Weight expressions: where a weight's values come from
//===----------------------------------------------------------------------===//

def Kiln_WeightExprAttrInterface : AttrInterface<"WeightExprAttrInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    A weight expression: the value of a `kiln.weight` before it is encoded. Its
    leaves are `#kiln.source` byte ranges of the checkpoint; `#kiln.concat`,
    `#kiln.slice` and `#kiln.permute` transform them. Every node knows the shape
    and the safetensors dtype of the value it yields, so the verifiers check an
    expression without reading a byte, and the artifact writer, calibration and the
    precision report enumerate the leaves with `kiln::getWeightSources`.
  }];
  let methods = [
    InterfaceMethod<[{
        The shape of the value the expression yields, or std::nullopt when it is
        not stated: a `#kiln.source` without `shape`, which takes the shape of its
        weight (allowed only as a weight's whole expression).
      }], "std::optional<::llvm::SmallVector<int64_t>>", "getResultShape">,
    InterfaceMethod<[{
        The safetensors dtype (F32, F16 or BF16) of the leaves, which the verifiers
        require to be the same for every leaf of an expression.
      }], "::llvm::StringRef", "getElementDtype">,
    InterfaceMethod<[{
        The operand expressions, in order; none for a source.
      }], "::llvm::SmallVector<::mlir::Attribute>", "getExprOperands">,
  ];
}

def Kiln_SourceAttr : Kiln_Attr<"Source", "source",
    [DeclareAttrInterfaceMethods<Kiln_WeightExprAttrInterface>]> {
  let summary = "Where a weight's bytes live in the source checkpoint";
  let description = [{
    A reference into a checkpoint file: the file name relative to the module's
    `kiln.checkpoint` directory, the byte offset of the tensor's data from the start
    of the file, its size in bytes and its safetensors dtype. The bytes themselves
    are never copied into the IR. The elements are row-major.

    As a weight's whole expression the source takes the weight's shape. As an
    operand of a transform (`#kiln.concat`, `#kiln.slice`, `#kiln.permute`) it
    states its own `shape`; then `size` must equal the product of the shape times
    the dtype's bytes.

    ```mlir
    #kiln.source<"model-00001-of-00002.safetensors", offset = 1048576, size = 663552, dtype = "BF16">
    #kiln.source<"model.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>
    ```
  }];
  let parameters = (ins
    StringRefParameter<"file name, relative to the checkpoint directory">:$file,
    "uint64_t":$offset,
    "uint64_t":$size,
    StringRefParameter<"safetensors dtype (F32, F16, BF16)">:$dtype,
    OptionalArrayRefParameter<"int64_t", "row-major shape (none: the weight's)">:$shape);
  let builders = [
    AttrBuilder<(ins "::llvm::StringRef":$file, "uint64_t":$offset, "uint64_t":$size,
                     "::llvm::StringRef":$dtype), [{
      return $_get($_ctxt, file, offset, size, dtype, ::llvm::ArrayRef<int64_t>());
    }]>
  ];
  let assemblyFormat = [{
    `<` $file `,` `offset` `=` $offset `,` `size` `=` $size `,` `dtype` `=` $dtype
    (`,` `shape` `=` `[` $shape^ `]`)? `>`
  }];
  let genVerifyDecl = 1;
}

def Kiln_ConcatAttr : Kiln_Attr<"Concat", "concat",
    [DeclareAttrInterfaceMethods<Kiln_WeightExprAttrInterface>]> {
  let summary = "Weight expression: operands joined along one axis";
  let description = [{
    Concatenates weight expressions along `axis`. The operands have the same rank
    and the same dimensions except along `axis`, and the same dtype; the result's
    dimension along `axis` is the sum of theirs. Fusing the Q, K and V projections
    into one GEMM is a concatenation along axis 0 of their `[out, in]` weights.

    ```mlir
    #kiln.concat<axis = 0, [
        #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>,
        #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [8, 32]>]>
    ```
  }];
  let parameters = (ins
    "int64_t":$axis,
    ArrayRefParameter<"::mlir::Attribute", "weight expressions">:$operands);
  let assemblyFormat = "`<` `axis` `=` $axis `,` `[` $operands `]` `>`";
  let genVerifyDecl = 1;
}

def Kiln_SliceAttr : Kiln_Attr<"Slice", "slice",
    [DeclareAttrInterfaceMethods<Kiln_WeightExprAttrInterface>]> {
  let summary = "Weight expression: a rectangular part of an operand";
  let description = [{
    The elements `[offsets[d], offsets[d] + sizes[d])` of every dimension `d` of
    the operand, which must lie inside it. The result's shape is `sizes`.

    ```mlir
    #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>,
                offsets = [0, 16], sizes = [16, 16]>
    ```
  }];
  let parameters = (ins
    "::mlir::Attribute":$operand,
    ArrayRefParameter<"int64_t", "first element per dimension">:$offsets,
    ArrayRefParameter<"int64_t", "elements per dimension">:$sizes);
  let assemblyFormat = [{
    `<` $operand `,` `offsets` `=` `[` $offsets `]` `,` `sizes` `=` `[` $sizes `]` `>`
  }];
  let genVerifyDecl = 1;
}

def Kiln_PermuteAttr : Kiln_Attr<"Permute", "permute",
    [DeclareAttrInterfaceMethods<Kiln_WeightExprAttrInterface>]> {
  let summary = "Weight expression: the operand's dimensions reordered";
  let description = [{
    Dimension `i` of the result is dimension `dims[i]` of the operand (as
    `torch.permute`); `dims` is a permutation of `[0, rank)`. `dims = [1, 0]`
    transposes a matrix.

    ```mlir
    #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>,
                  dims = [1, 0]>
    ```
  }];
  let parameters = (ins
    "::mlir::Attribute":$operand,
    ArrayRefParameter<"int64_t", "operand dimension of each result dimension">:$dims);
  let assemblyFormat = "`<` $operand `,` `dims` `=` `[` $dims `]` `>`";
  let genVerifyDecl = 1;
}

def Kiln_EncodingAttr : Kiln_Attr<"Encoding", "encoding"> {
  let summary = "Storage encoding (precision) of a weight";
  let description = [{
    The numeric format a weight is stored in inside the artifact, and how the layer's
    activations meet it. Float encodings keep one value per element; `fp8_*` carry a
    per-output-channel scale; `int8` is per-output-channel symmetric; `int4` is
    group-wise along the input dimension, symmetric or asymmetric (zero points).
    `act = int8_per_token` quantises activations dynamically per token (W8A8/W4A8).

    ```mlir
    #kiln.encoding<bf16>
    #kiln.encoding<int8>
    #kiln.encoding<int4, group = 32>
    #kiln.encoding<int4, group = 64, asym, act = int8_per_token>
    ```
  }];
  let parameters = (ins
    "EncodingKind":$kind,
    DefaultValuedParameter<"int64_t", "0">:$groupSize,
    DefaultValuedParameter<"bool", "true">:$symmetric,
    DefaultValuedParameter<"ActivationMode", "ActivationMode::Float">:$activation);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Short name used on command lines and in reports: "bf16", "fp8_e4m3",
    /// "int8", "int8_a8" (int8 activations), "int4_g32", "int4_g64_asym", ...
    std::string getLabel() const;
    /// The encoding a label names, or null (with *error set) for a malformed label.
    static EncodingAttr fromLabel(::mlir::MLIRContext* context, ::llvm::StringRef label,
                                  std::string* error);
    // Sizes and byte layouts are the artifact contract's (formats/encoding.h,
    // reached through passes/Encoding.h), not the dialect's.
  }];
}

#endif // KILN_DIALECT_KILNATTRS_TD
