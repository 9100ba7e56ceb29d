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
    I32EnumAttrCase<"panel16", 2>,
    I32EnumAttrCase<"int4_p16k8", 3>,
    I32EnumAttrCase<"int8_p16k4", 4>,
    I32EnumAttrCase<"int4_p128k4", 5>,
    I32EnumAttrCase<"int4_p16k16", 6>]> {
  let cppNamespace = "::kiln";
  let genSpecializedAttr = 0;
}
def Kiln_LayoutAttr : EnumAttr<Kiln_Dialect, Kiln_LayoutKind, "layout"> {
  let summary = "Arrangement of a weight's elements in the artifact";
  let description = [{
    `row_major` is the weight's logical shape in row-major order (the default of
    `kiln.weight`). `panel16` is a float weight (f32, f16, bf16) or an fp8 one
    (codes; row scales after them) packed for the generated matmuls with float
    activations by `kiln-pack-weights`: rows in panels of 16, each panel column by
    column. `int4_p16k8` is a symmetric int4 weight packed for the generated
    matmuls (W4A8 and W4A16), which multiply a panel by one activation row at a
    time: rows in panels of 16, columns in steps of 8 whose two halves share bytes
    (codes 0..15, the low nibble the first 4 columns), scales interleaved by
    panel. `int8_p16k4` is an int8 weight for the same kernels (W8A8 and W8A16):
    rows in panels of 16, columns in steps of 4. `int4_p128k4` is a symmetric
    int4 weight packed for the generated SME2 matmuls with int8 activations
    (W4A8), which expand the codes with a table lookup (LUTI4): rows in panels of
    128, columns in steps of 4, each row's 4 codes of a step in two bytes, the
    first column in the low nibble, scales interleaved by panel. `int4_p16k16`
    is a symmetric int4 weight packed for the generated matmuls with int8
    activations on Arm with i8mm (SMMLA): rows in panels of 16 (whole panels
    only), columns in steps of 16, each channel pair's 16 bytes of a step
    together (the low nibbles the first 8 columns), scales interleaved by panel
    (formats/encoding.h gives the bytes of all five).

    ```mlir
    #kiln.layout<row_major>
    #kiln.layout<panel16>
    #kiln.layout<int4_p16k8>
    #kiln.layout<int8_p16k4>
    #kiln.layout<int4_p128k4>
    #kiln.layout<int4_p16k16>
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
    `#kiln.slice`, `#kiln.permute` and `#kiln.weighted_sum` transform them. Every node knows the shape
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

    With `block = B` (B > 0) the operands, which then have the same extent along
    `axis` too, are interleaved in blocks of B: the result takes B slices of
    operand 0, B of operand 1, ..., then the next B of operand 0; the last block
    of each operand may be shorter. Fusing a gated MLP's gate and up projections
    interleaves their rows (in blocks of 128 by default), so that every 2 x B rows
    of the product hold B channels of gate and the same B of up side by side.

    ```mlir
    #kiln.concat<axis = 0, [
        #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>,
        #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [8, 32]>]>
    #kiln.concat<axis = 0, block = 16, [G, U]>   // rows G[0:16], U[0:16], G[16:32], U[16:32], ...
    ```
  }];
  let parameters = (ins
    "int64_t":$axis,
    ArrayRefParameter<"::mlir::Attribute", "weight expressions">:$operands,
    DefaultValuedParameter<"int64_t", "0", "interleave block along axis (0: whole operands)">:$block);
  let builders = [
    AttrBuilder<(ins "int64_t":$axis, "::llvm::ArrayRef<::mlir::Attribute>":$operands), [{
      return $_get($_ctxt, axis, operands, 0);
    }]>
  ];
  let assemblyFormat = "`<` `axis` `=` $axis `,` (`block` `=` $block^ `,`)? `[` $operands `]` `>`";
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

def Kiln_WeightedSumAttr : Kiln_Attr<"WeightedSum", "weighted_sum",
    [DeclareAttrInterfaceMethods<Kiln_WeightExprAttrInterface>]> {
  let summary = "Weight expression: operands of one shape added with coefficients";
  let description = [{
    `weights[0] x operands[0] + weights[1] x operands[1] + ...`, element by
    element, computed in double precision and rounded once to f32 before the
    weight is encoded. The operands have the same shape and dtype; there is one
    finite coefficient per operand. Merging mixture-of-experts experts
    (kiln-prune-experts with `merge`) makes each kept expert's weights the
    routing-mass-weighted mean of its own and those of the experts merged into it.

    ```mlir
    #kiln.weighted_sum<[
        #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>,
        #kiln.source<"m.safetensors", offset = 2048, size = 2048, dtype = "F32", shape = [16, 32]>],
        weights = array<f64: 0.75, 0.25>>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"::mlir::Attribute", "weight expressions">:$operands,
    "::mlir::Attribute":$weights);
  let assemblyFormat = "`<` `[` $operands `]` `,` `weights` `=` $weights `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The coefficients (`weights`, an array<f64>, printed in full precision).
    ::llvm::ArrayRef<double> getCoefficients() const {
      auto a = ::llvm::dyn_cast_or_null<::mlir::DenseF64ArrayAttr>(getWeights());
      return a ? a.asArrayRef() : ::llvm::ArrayRef<double>();
    }
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

//===----------------------------------------------------------------------===//
// Module configuration: what travels to the artifact's model facts
//===----------------------------------------------------------------------===//

// A float parameter, printed so that it reads back to the same double.
class Kiln_F64Parameter<string desc, string default> : AttrOrTypeParameter<"::kiln::F64", desc> {
  let parser = "::kiln::parseF64Parameter($_parser)";
  let printer = "::kiln::printF64Parameter($_printer, $_self)";
  let defaultValue = default;
}

// Lists in brackets (`[1, 2]`), so they sit among a struct's comma-separated fields.
class Kiln_ListParameter<string element, string desc> : ArrayRefParameter<element, desc> {
  let parser = "::kiln::parseListParameter<" # element # ">($_parser)";
  let printer = "::kiln::printListParameter($_printer, $_self)";
}

def Kiln_TextConfigAttr : Kiln_Attr<"TextConfig", "text_config"> {
  let summary = "Shape of the decoder language model (module attribute kiln.text)";
  let description = [{
    The decoder's dimensions as the importer read them from the checkpoint's
    config.json, written to the artifact's TextConfig. `sliding_window` 0 means
    full attention; `tie_word_embeddings` says the LM head reads the embedding
    table. Every count is at least 1 and `num_heads` is a multiple of
    `num_kv_heads`.

    ```mlir
    module attributes {kiln.text = #kiln.text_config<vocab_size = 512, hidden_size = 64,
        num_layers = 2, num_heads = 4, num_kv_heads = 2, head_dim = 16,
        max_position_embeddings = 2048>} {}
    ```
  }];
  let parameters = (ins
    "int64_t":$vocab_size, "int64_t":$hidden_size, "int64_t":$num_layers,
    "int64_t":$num_heads, "int64_t":$num_kv_heads, "int64_t":$head_dim,
    "int64_t":$max_position_embeddings,
    DefaultValuedParameter<"bool", "false">:$tie_word_embeddings,
    DefaultValuedParameter<"int64_t", "0", "tokens of the attention window (0: all)">:$sliding_window);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Kiln_KvCacheAttr : Kiln_Attr<"KvCache", "kv_cache"> {
  let summary = "Encoding of the decoder's KV cache (module attribute kiln.kv_cache)";
  let description = [{
    How a session stores the keys and values of every decoder layer, decided by
    `kiln-plan-memory` (`kv-cache` option; `kiln-compile --kv-cache`) and written to
    the artifact's TextConfig. `f32` and `f16` store the elements; `int8` and `int4`
    symmetric codes with one f32 scale per `group` channels of a position's keys or
    values. `group` divides `head_dim` (checked against `kiln.text` when the
    artifact is written); formats/kv_codec.h gives the bytes.

    ```mlir
    module attributes {kiln.kv_cache = #kiln.kv_cache<int8, group = 32>} {}
    module attributes {kiln.kv_cache = #kiln.kv_cache<f16>} {}
    ```
  }];
  let parameters = (ins
    "EncodingKind":$kind,
    DefaultValuedParameter<"int64_t", "0", "channels per scale (int8, int4)">:$group);
  let assemblyFormat = "`<` $kind (`,` `group` `=` $group^)? `>`";
  let genVerifyDecl = 1;
}

def Kiln_ImageConfigAttr : Kiln_Attr<"ImageConfig", "image_config"> {
  let summary = "The image input of a vision-language model (module attribute kiln.image)";
  let description = [{
    The encoder's square input size and channels, the number of image tokens the
    projector hands the decoder per image, and the placeholder token id the prompt
    carries where they go.

    ```mlir
    #kiln.image_config<image_size = 32, channels = 3, image_tokens = 16, image_token_id = 480>
    ```
  }];
  let parameters = (ins "int64_t":$image_size, "int64_t":$channels, "int64_t":$image_tokens,
                        "int64_t":$image_token_id);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Kiln_PreprocessorConfigAttr : Kiln_Attr<"PreprocessorConfig", "preprocessor_config"> {
  let summary = "Image preprocessing (module attribute kiln.preprocessor)";
  let description = [{
    The checkpoint's preprocessor_config.json as the runtime reproduces it:
    `processor` is `CLIPImageProcessor` or `Idefics3ImageProcessor`; `resample` is a PIL filter number; `crop_size` is
    `[height, width]`; `image_mean` and `image_std` have one value per channel.

    ```mlir
    #kiln.preprocessor_config<processor = "CLIPImageProcessor", do_convert_rgb = true,
        do_resize = true, shortest_edge = 32, longest_edge = 0, resample = 3,
        do_center_crop = true, crop_size = [32, 32], do_rescale = true,
        rescale_factor = 0.0039215686274509803, do_normalize = true,
        image_mean = [0.5, 0.5, 0.5], image_std = [0.5, 0.5, 0.5], max_image_edge = 0>
    ```
  }];
  let parameters = (ins
    StringRefParameter<"image processor class">:$processor,
    "bool":$do_convert_rgb, "bool":$do_resize, "int64_t":$shortest_edge,
    "int64_t":$longest_edge, "int64_t":$resample, "bool":$do_center_crop,
    Kiln_ListParameter<"int64_t", "[height, width]">:$crop_size,
    "bool":$do_rescale, Kiln_F64Parameter<"pixel scale", "">:$rescale_factor,
    "bool":$do_normalize,
    Kiln_ListParameter<"::kiln::F64", "mean per channel">:$image_mean,
    Kiln_ListParameter<"::kiln::F64", "standard deviation per channel">:$image_std,
    "int64_t":$max_image_edge);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Kiln_GenerationConfigAttr : Kiln_Attr<"GenerationConfig", "generation_config"> {
  let summary = "Special tokens and sampling defaults (module attribute kiln.generation)";
  let description = [{
    From generation_config.json (or config.json): the end-of-sequence ids,
    optional beginning-of-sequence and padding ids (-1: none) and the
    default sampling settings (`max_new_tokens` 0: the session's limit).

    ```mlir
    #kiln.generation_config<bos_token_id = 1, eos_token_ids = [2]>
    #kiln.generation_config<eos_token_ids = [2, 7], do_sample = true, temperature = 0.7, top_k = 50, top_p = 0.9>
    #kiln.generation_config<eos_token_ids = [2], repetition_penalty = 1.2>
    ```

    `repetition_penalty` is transformers' (1: off): before choosing a token, the
    logit of every id already in the sequence (prompt and answer) is divided by it
    when positive and multiplied by it when negative.
  }];
  let parameters = (ins
    DefaultValuedParameter<"int64_t", "-1">:$bos_token_id,
    Kiln_ListParameter<"int64_t", "end-of-sequence ids">:$eos_token_ids,
    DefaultValuedParameter<"int64_t", "-1">:$pad_token_id,
    DefaultValuedParameter<"bool", "false">:$do_sample,
    Kiln_F64Parameter<"sampling temperature", "::kiln::F64(1.0)">:$temperature,
    DefaultValuedParameter<"int64_t", "0">:$top_k,
    Kiln_F64Parameter<"nucleus mass", "::kiln::F64(1.0)">:$top_p,
    DefaultValuedParameter<"int64_t", "0">:$max_new_tokens,
    Kiln_F64Parameter<"repetition penalty", "::kiln::F64(1.0)">:$repetition_penalty);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Kiln_TokenizerConfigAttr : Kiln_Attr<"TokenizerConfig", "tokenizer_config"> {
  let summary = "The tokenizer file the writer embeds (module attribute kiln.tokenizer)";
  let description = [{
    The tokenizer.json of the checkpoint directory, with the vocabulary and
    added-token counts the importer found in it.

    ```mlir
    #kiln.tokenizer_config<file = "tokenizer.json", vocab = 500, added_tokens = 4>
    ```
  }];
  let parameters = (ins StringRefParameter<"file in the checkpoint directory">:$file,
                        "int64_t":$vocab, "int64_t":$added_tokens);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Kiln_TargetAttr : Kiln_Attr<"Target", "target"> {
  let summary = "The CPU kernels were selected and generated for (module attribute kiln.target)";
  let description = [{
    Set by kiln-select-kernels and read by the kernel generator: the LLVM target
    triple, the comma-separated CPU features (LLVM names), and whether kernels are
    generated for the module (false for `--target=portable`).

    ```mlir
    #kiln.target<triple = "aarch64-linux-android", features = "neon,fp-armv8,dotprod", generate = true>
    ```
  }];
  let parameters = (ins StringRefParameter<"LLVM target triple">:$triple,
                        StringRefParameter<"CPU features, comma-separated">:$features,
                        "bool":$generate);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif // KILN_DIALECT_KILNATTRS_TD
