//===- KilnAttrs.td - kiln dialect attributes --------------*- tablegen -*-===//

#ifndef KILN_DIALECT_KILNATTRS_TD
#define KILN_DIALECT_KILNATTRS_TD

include "dialects/kiln/KilnBase.td"
include "mlir/IR/EnumAttr.td"

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

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def Kiln_SourceAttr : Kiln_Attr<"Source", "source"> {
  let summary = "Where a weight's bytes live in the source checkpoint";
  let description = [{
    A reference into a checkpoint file: the file name relative to the module's
    `kiln.checkpoint` directory, the byte offset of the tensor's data from the start
    of the file, its size in bytes and its safetensors dtype. The bytes themselves
    are never copied into the IR.

    ```mlir
    #kiln.source<"model-00001-of-00002.safetensors", offset = 1048576, size = 663552, dtype = "BF16">
    ```
  }];
  let parameters = (ins
    StringRefParameter<"file name, relative to the checkpoint directory">:$file,
    "uint64_t":$offset,
    "uint64_t":$size,
    StringRefParameter<"safetensors dtype (F32, F16, BF16)">:$dtype);
  let assemblyFormat = [{
    `<` $file `,` `offset` `=` $offset `,` `size` `=` $size `,` `dtype` `=` $dtype `>`
  }];
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
