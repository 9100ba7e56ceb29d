//===- KilnOps.td - kiln dialect operations ----------------*- tablegen -*-===//
//
// Layer-level operations of vision-language models. Activations are f32 tensors
// whose leading dimension counts tokens (or image patches); weights are values of
// `kiln.weight_ref` ops and keep the element type of the checkpoint.
//
//===----------------------------------------------------------------------===//

#ifndef KILN_DIALECT_KILNOPS_TD
#define KILN_DIALECT_KILNOPS_TD

include "dialects/kiln/KilnBase.td"
include "dialects/kiln/KilnAttrs.td"
include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Kiln_Activation : RankedTensorOf<[F32]>;
def Kiln_Weight : RankedTensorOf<[F32, F16, BF16]>;
def Kiln_Ids : RankedTensorOf<[I32]>;

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

def Kiln_WeightOp : Kiln_Op<"weight", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "A weight tensor of the model, referenced in its source checkpoint";
  let description = [{
    Declares a weight: its hub tensor name (the symbol), its logical type (shape and
    the checkpoint's element type), where its values come from, the encoding it will
    be stored in (`#kiln.encoding`), which the precision passes change, and the
    layout of its elements in the artifact. Weight bytes are never part of the IR.

    The values are a weight expression (`WeightExprAttrInterface`): most often one
    tensor of the checkpoint (`#kiln.source`, printed without its prefix, which takes
    the weight's shape), or transforms of one or more tensors: `#kiln.concat`,
    `#kiln.slice`, `#kiln.permute`, `#kiln.weighted_sum`, nested freely, whose leaves are `#kiln.source`s
    with a `shape`. The expression's shape must be the weight's and its leaves'
    dtype the element type. The artifact writer evaluates the expression, then
    encodes the result. `layout` (default `#kiln.layout<row_major>`, then not
    printed) is how the encoded elements are arranged.

    Example:

    ```mlir
    kiln.weight @model.norm.weight : tensor<576xbf16>
        from #kiln.source<"model.safetensors", offset = 1152, size = 1152, dtype = "BF16">
        as #kiln.encoding<bf16>
    // Q and K projections fused into one [24, 32] weight.
    kiln.weight @qk : tensor<24x32xf32>
        from #kiln.concat<axis = 0, [
            #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>,
            #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [8, 32]>]>
        as #kiln.encoding<int8> layout #kiln.layout<row_major>
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Kiln_Weight>:$type,
                       Kiln_WeightExprAttrInterface:$source,
                       Kiln_EncodingAttr:$encoding,
                       DefaultValuedAttr<Kiln_LayoutAttr, "::kiln::LayoutKind::row_major">:$layout);
  let assemblyFormat = [{
    $sym_name `:` $type `from` custom<WeightExpr>($source) `as` $encoding
    (`layout` $layout^)? attr-dict
  }];
  let builders = [
    // The default layout.
    OpBuilder<(ins "::mlir::StringAttr":$sym_name, "::mlir::TypeAttr":$type,
                   "::kiln::WeightExprAttrInterface":$source, "::kiln::EncodingAttr":$encoding), [{
      build($_builder, $_state, sym_name, type, source, encoding, ::kiln::LayoutKindAttr());
    }]>
  ];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
    /// The leaf sources of the weight's expression, in order (kiln::getWeightSources).
    ::llvm::SmallVector<SourceAttr> getSources() { return getWeightSources(getSource()); }
    /// The checkpoint bytes the expression reads: the sum of its leaves' sizes.
    uint64_t getSourceBytes() { return getWeightSourceBytes(getSource()); }
    /// The safetensors dtype of every leaf (F32, F16 or BF16).
    ::llvm::StringRef getSourceDtype() { return getSource().getElementDtype(); }
    /// The source when the expression is one plain tensor of the checkpoint (no
    /// transform), else null.
    SourceAttr getPlainSource() { return ::llvm::dyn_cast<SourceAttr>(getSource()); }
  }];
}

def Kiln_WeightRefOp : Kiln_Op<"weight_ref",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "The value of a weight inside a stage";
  let description = [{
    Makes the weight named by `name` available as an SSA value. Its type must be the
    weight's declared type. Several stages may refer to the same weight (decoder
    prefill and decode; tied embeddings in the embedding and the LM head).

    ```mlir
    %w = kiln.weight_ref @model.norm.weight : tensor<576xbf16>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Kiln_Weight:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Embeddings and token handling
//===----------------------------------------------------------------------===//

def Kiln_EmbeddingOp : Kiln_Op<"embedding", [Pure]> {
  let summary = "Token embedding lookup";
  let description = [{
    Gathers rows of `table` ([vocab, hidden]) for every id in `ids` ([tokens]).
    An id outside [0, vocab) is a runtime error, never a wild read, except
    `placeholder_id`: a VLM's image token whose id lies past the vocabulary (as
    LLaVA-1.5's 32000 may) yields a zero row that `kiln.merge_image_tokens`
    overwrites, as transformers' LLaVA does.

    ```mlir
    %e = kiln.embedding %table, %ids : tensor<49280x576xbf16>, tensor<?xi32> -> tensor<?x576xf32>
    %f = kiln.embedding %table, %ids {placeholder_id = 32000 : i64}
        : tensor<32000x4096xf16>, tensor<?xi32> -> tensor<?x4096xf32>
    ```
  }];
  let arguments = (ins Kiln_Weight:$table, Kiln_Ids:$ids, OptionalAttr<I64Attr>:$placeholder_id);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$table `,` $ids attr-dict `:` type($table) `,` type($ids) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_MergeImageTokensOp : Kiln_Op<"merge_image_tokens", [Pure]> {
  let summary = "Replace image-token positions with image features";
  let description = [{
    Writes the rows of `image` ([image_tokens, hidden]), in order, into the rows of
    `embeds` ([tokens, hidden]) whose id in `ids` equals `image_token_id`; other rows
    pass through. The number of such ids must equal the number of image rows
    (checked at run time). This is LLaVA's and Idefics3's `masked_scatter`.

    ```mlir
    %m = kiln.merge_image_tokens %e, %ids, %img {image_token_id = 32000 : i64}
        : tensor<?x4096xf32>, tensor<?xi32>, tensor<?x4096xf32> -> tensor<?x4096xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$embeds, Kiln_Ids:$ids, Kiln_Activation:$image,
                       I64Attr:$image_token_id);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $embeds `,` $ids `,` $image attr-dict `:` type($embeds) `,` type($ids) `,` type($image)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra and element-wise ops
//===----------------------------------------------------------------------===//

def Kiln_LinearOp : Kiln_Op<"linear", [Pure, AttrSizedOperandSegments]> {
  let summary = "Fully connected layer: y = x W^T + b";
  let description = [{
    `input` is [rows, in_features]; `weight` is [out_features, in_features] in the
    PyTorch `nn.Linear` layout of the checkpoint; the optional `bias` is
    [out_features]. The result is [rows, out_features] in f32.

    Fusions (the `kiln-fuse-*` passes make them): with `norm` ("rms" or "layer") the
    input is normalised inside the op first, with `norm_weight` (and the layer
    norm's `norm_bias`) and `norm_epsilon` (the prologue); with `residual`
    ([rows, out_features]) the result is `residual + x W^T + b`, and with
    `activation` `act(x W^T + b)` (`residual + act(...)` with both): the epilogue.
    With `qkv` (`kiln-fuse-rope`: `num_heads`, `num_kv_heads`, `head_dim`, optional
    `cache_layer` and `rope`, the rotary parameters of `kiln.rope`) the result is the
    q|k|v of a `kiln.qkv_attention` with `kv_written`: q and k are rotated at
    `positions` in the epilogue and, with `cache_layer`, k and v are written into the
    session's KV cache there (a side effect the attention reading the result relies on).

    ```mlir
    %q = kiln.linear %x, %wq : tensor<?x576xf32>, tensor<576x576xbf16> -> tensor<?x576xf32>
    %k = kiln.linear %x, %wk, %bk
        : tensor<?x896xf32>, tensor<128x896xbf16>, tensor<128xbf16> -> tensor<?x128xf32>
    %h = kiln.linear %a, %wo residual(%x) : tensor<?x576xf32>, tensor<576x576xbf16>
        residual tensor<?x576xf32> -> tensor<?x576xf32>
    %qkv = kiln.linear %x, %wqkv norm(%wn) {norm = "rms", norm_epsilon = 1.0e-05 : f32}
        : tensor<?x576xf32>, tensor<960x576xbf16> norm tensor<576xbf16> -> tensor<?x960xf32>
    %qkv = kiln.linear %x, %wqkv positions(%pos) {qkv = {num_heads = 9 : i64,
        num_kv_heads = 3 : i64, head_dim = 64 : i64, cache_layer = 0 : i64, rope = {...}}}
        : tensor<?x576xf32>, tensor<960x576xbf16> positions tensor<?xi32> -> tensor<?x960xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$weight,
                       Optional<Kiln_Weight>:$bias, Optional<Kiln_Activation>:$residual,
                       Optional<Kiln_Ids>:$positions,
                       Optional<Kiln_Weight>:$norm_weight, Optional<Kiln_Weight>:$norm_bias,
                       OptionalAttr<StrAttr>:$norm, OptionalAttr<F32Attr>:$norm_epsilon,
                       OptionalAttr<Kiln_ActivationAttr>:$activation, OptionalAttr<DictionaryAttr>:$qkv);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? (`residual` `(` $residual^ `)`)? (`positions` `(` $positions^ `)`)?
    (`norm` `(` $norm_weight^ `)`)? (`norm_bias` `(` $norm_bias^ `)`)? attr-dict `:`
    type($input) `,` type($weight) (`,` type($bias)^)? (`residual` type($residual)^)?
    (`positions` type($positions)^)? (`norm` type($norm_weight)^)? (`norm_bias` type($norm_bias)^)?
    `->` type($result)
  }];
  let builders = [
    // Unfused (the importer's).
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input, "::mlir::Value":$weight,
                   "::mlir::Value":$bias), [{
      build($_builder, $_state, result, input, weight, bias, ::mlir::Value(), ::mlir::Value(), ::mlir::Value(),
            ::mlir::Value(), ::mlir::StringAttr(), ::mlir::FloatAttr(), ActivationKindAttr(), ::mlir::DictionaryAttr());
    }]>
  ];
  let hasVerifier = 1;
}

def Kiln_LmHeadOp : Kiln_Op<"lm_head", [Pure]> {
  let summary = "Language-model head: hidden states to vocabulary logits";
  let description = [{
    `logits = hidden W^T` with `weight` [vocab, hidden]. With tied embeddings the
    weight is the token embedding table. Kept apart from `kiln.linear` because its
    output is the model's output and its size (the vocabulary) dominates decode.

    ```mlir
    %l = kiln.lm_head %h, %w : tensor<?x576xf32>, tensor<49280x576xbf16> -> tensor<?x49280xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$weight);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` type($weight) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_AddOp : Kiln_Op<"add", [Pure, SameOperandsAndResultType]> {
  let summary = "Element-wise addition (residual connections)";
  let description = [{
    ```mlir
    %r = kiln.add %a, %b : tensor<?x576xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$lhs, Kiln_Activation:$rhs);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Kiln_MulOp : Kiln_Op<"mul", [Pure, SameOperandsAndResultType]> {
  let summary = "Element-wise multiplication";
  let description = [{
    ```mlir
    %r = kiln.mul %a, %b : tensor<?x1536xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$lhs, Kiln_Activation:$rhs);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Kiln_ActivationOp : Kiln_Op<"activation", [Pure, SameOperandsAndResultType]> {
  let summary = "Element-wise activation function";
  let description = [{
    `silu` (x·σ(x)), `gelu` (exact, erf), `gelu_tanh` (the tanh approximation,
    `gelu_pytorch_tanh`), `quick_gelu` (x·σ(1.702x), CLIP) or `relu`.

    ```mlir
    %y = kiln.activation %x {kind = #kiln.activation<quick_gelu>} : tensor<577x1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_ActivationAttr:$kind);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Kiln_GatedMlpOp : Kiln_Op<"gated_mlp", [Pure, AttrSizedOperandSegments]> {
  let summary = "Gated MLP: down(act(gate(x)) * up(x))";
  let description = [{
    The feed-forward block of Llama, Qwen2 and each Mixtral expert. `gate` and `up`
    are [intermediate, hidden], `down` is [hidden, intermediate]; no biases.
    Fusions as `kiln.linear`'s: a `norm` prologue (normalising the input once for
    gate and up) and a `residual` added to the result.

    Fused by `kiln-fuse-gate-up`, the op has no `up`: `gate` is then the
    [2 x intermediate, hidden] weight interleaving the gate's and the up's rows in
    blocks of `gate_up_block` (a `#kiln.concat` with that `block`), one matrix
    product whose epilogue writes act(gate) * up.

    ```mlir
    %y = kiln.gated_mlp %x, %g, %u, %d {activation = #kiln.activation<silu>}
        : tensor<?x576xf32>, tensor<1536x576xbf16>, tensor<1536x576xbf16>,
          tensor<576x1536xbf16> -> tensor<?x576xf32>
    %y = kiln.gated_mlp %x, %gu, %d {activation = #kiln.activation<silu>, gate_up_block = 16 : i64}
        : tensor<?x576xf32>, tensor<3072x576xbf16>, tensor<576x1536xbf16> -> tensor<?x576xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$gate, Optional<Kiln_Weight>:$up,
                       Kiln_Weight:$down, Optional<Kiln_Activation>:$residual,
                       Optional<Kiln_Weight>:$norm_weight, Optional<Kiln_Weight>:$norm_bias,
                       Kiln_ActivationAttr:$activation,
                       OptionalAttr<StrAttr>:$norm, OptionalAttr<F32Attr>:$norm_epsilon,
                       OptionalAttr<I64Attr>:$gate_up_block);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $gate `,` custom<UpDown>($up, $down) (`residual` `(` $residual^ `)`)?
    (`norm` `(` $norm_weight^ `)`)? (`norm_bias` `(` $norm_bias^ `)`)? attr-dict `:`
    type($input) `,` type($gate) `,` custom<UpDown>(type($up), type($down))
    (`residual` type($residual)^)? (`norm` type($norm_weight)^)? (`norm_bias` type($norm_bias)^)?
    `->` type($result)
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input, "::mlir::Value":$gate,
                   "::mlir::Value":$up, "::mlir::Value":$down, "ActivationKindAttr":$activation), [{
      build($_builder, $_state, result, input, gate, up, down, ::mlir::Value(), ::mlir::Value(),
            ::mlir::Value(), activation, ::mlir::StringAttr(), ::mlir::FloatAttr(), ::mlir::IntegerAttr());
    }]>
  ];
  let hasVerifier = 1;
}

def Kiln_MoeOp : Kiln_Op<"moe", [Pure, AttrSizedOperandSegments]> {
  let summary = "Mixture-of-experts block with top-k routing";
  let description = [{
    Mixtral's sparse MoE block. Router logits are `input router^T` ([tokens,
    experts]); per token the `top_k` experts with the largest softmax probability are
    chosen and, with `normalize_top_k`, their probabilities renormalised to sum to 1
    (equivalently, a softmax over the chosen logits). Each chosen expert is a gated
    MLP (`gate`/`up`/`down`, one weight of each per expert); the outputs are summed
    with the routing weights. A fused `residual` (kiln-fuse-residual) is added to the
    sum.

    `expert_ids` gives each remaining expert's index in the source checkpoint, so
    that experts pruned at compile time leave a readable trace. With
    `normalize_top_k`, removing an expert (its router row and its weights) is
    exactly "never route to it".

    ```mlir
    %y = kiln.moe %x, %router gate(%g0, %g1) up(%u0, %u1) down(%d0, %d1)
        {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>,
         expert_ids = array<i64: 0, 1>}
        : tensor<?x64xf32>, tensor<2x64xf32>, (tensor<128x64xf32>, tensor<128x64xf32>),
          (tensor<128x64xf32>, tensor<128x64xf32>), (tensor<64x128xf32>, tensor<64x128xf32>)
          -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Optional<Kiln_Activation>:$residual,
                       Kiln_Weight:$router,
                       Variadic<Kiln_Weight>:$gate, Variadic<Kiln_Weight>:$up,
                       Variadic<Kiln_Weight>:$down,
                       I64Attr:$top_k, BoolAttr:$normalize_top_k,
                       Kiln_ActivationAttr:$activation,
                       DenseI64ArrayAttr:$expert_ids);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input (`residual` `(` $residual^ `)`)? `,` $router `gate` `(` $gate `)` `up` `(` $up `)`
    `down` `(` $down `)` attr-dict `:` type($input) (`residual` type($residual)^)? `,`
    type($router) `,` `(` type($gate) `)` `,` `(` type($up) `)` `,` `(` type($down) `)`
    `->` type($result)
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input, "::mlir::Value":$router,
                   "::mlir::ValueRange":$gate, "::mlir::ValueRange":$up, "::mlir::ValueRange":$down,
                   "::mlir::IntegerAttr":$top_k, "::mlir::BoolAttr":$normalize_top_k,
                   "ActivationKindAttr":$activation, "::mlir::DenseI64ArrayAttr":$expert_ids), [{
      build($_builder, $_state, result, input, ::mlir::Value(), router, gate, up, down, top_k,
            normalize_top_k, activation, expert_ids);
    }]>
  ];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

def Kiln_RmsNormOp : Kiln_Op<"rms_norm", [Pure]> {
  let summary = "Root-mean-square normalisation over the last dimension";
  let description = [{
    Normalises every row of `input` by its root mean square and scales it by
    `weight`, as Llama's `LlamaRMSNorm` does:

    ```
    y = x / sqrt(mean(x * x) + epsilon) * weight
    ```

    `weight` is 1-D with the length of the last dimension of `input`.

    ```mlir
    %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32}
        : tensor<?x576xf32>, tensor<576xbf16> -> tensor<?x576xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$weight, F32Attr:$epsilon);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` type($weight) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_LayerNormOp : Kiln_Op<"layer_norm", [Pure]> {
  let summary = "Layer normalisation over the last dimension";
  let description = [{
    `y = (x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias` per row, with the
    biased variance, as `torch.nn.LayerNorm`.

    ```mlir
    %y = kiln.layer_norm %x, %w, %b {epsilon = 1.0e-05 : f32}
        : tensor<577x1024xf32>, tensor<1024xf16>, tensor<1024xf16> -> tensor<577x1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$weight, Kiln_Weight:$bias,
                       F32Attr:$epsilon);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $bias attr-dict `:` type($input) `,` type($weight) `,`
    type($bias) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Kiln_RopeOp : Kiln_Op<"rope", [Pure]> {
  let summary = "Rotary position embedding (rotate-half convention)";
  let description = [{
    Rotates each head of `input` ([tokens, num_heads * head_dim]) by the angles
    `positions[t] * inv_freq[i]`, pairing dimension i with i + head_dim/2 (Hugging
    Face's `rotate_half`), with `inv_freq[i] = theta^(-2i/head_dim)`.

    With `rope_type = "llama3"`, the frequencies are rescaled as in
    transformers' `_compute_llama3_parameters`: wavelengths above
    `original_max_position_embeddings / low_freq_factor` are divided by `factor`,
    those below `original_max_position_embeddings / high_freq_factor` are kept, and
    the band between is interpolated smoothly.

    ```mlir
    %q2 = kiln.rope %q, %pos {num_heads = 32 : i64, head_dim = 64 : i64,
                              theta = 5.0e+05 : f64, rope_type = "llama3",
                              factor = 3.2e+01 : f64, low_freq_factor = 1.0 : f64,
                              high_freq_factor = 4.0 : f64,
                              original_max_position_embeddings = 8192 : i64}
        : tensor<?x2048xf32>, tensor<?xi32> -> tensor<?x2048xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Ids:$positions,
                       I64Attr:$num_heads, I64Attr:$head_dim, F64Attr:$theta,
                       DefaultValuedStrAttr<StrAttr, "default">:$rope_type,
                       OptionalAttr<F64Attr>:$factor,
                       OptionalAttr<F64Attr>:$low_freq_factor,
                       OptionalAttr<F64Attr>:$high_freq_factor,
                       OptionalAttr<I64Attr>:$original_max_position_embeddings);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $positions attr-dict `:` type($input) `,` type($positions) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_AttentionOp : Kiln_Op<"attention"> {
  let summary = "Multi-head scaled dot-product attention, optionally over a KV cache";
  let description = [{
    `query` is [tokens, num_heads * head_dim]; `key` and `value` are [tokens,
    num_kv_heads * head_dim]; with grouped-query attention each KV head serves
    num_heads / num_kv_heads query heads. Scores are `q·k * scale`, softmax in f32.

    Without `cache_layer` the op attends within its inputs (bidirectional, or causal
    when `causal` is set): vision encoders. With `cache_layer = N` it is bound to
    layer N of the session's KV cache: keys and values of the new tokens are written
    at `positions`, and each new token attends (causally) to every cached position up
    to its own. That write is why the op is not `Pure`.

    ```mlir
    %o = kiln.attention %q, %k, %v positions(%pos)
        {num_heads = 9 : i64, num_kv_heads = 3 : i64, head_dim = 64 : i64,
         scale = 1.250000e-01 : f64, causal, cache_layer = 0 : i64}
        : tensor<?x576xf32>, tensor<?x192xf32>, tensor<?x192xf32>, tensor<?xi32>
          -> tensor<?x576xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$query, Kiln_Activation:$key, Kiln_Activation:$value,
                       Optional<Kiln_Ids>:$positions,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, I64Attr:$head_dim,
                       F64Attr:$scale, UnitAttr:$causal,
                       OptionalAttr<I64Attr>:$cache_layer);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`positions` `(` $positions^ `)`)? attr-dict `:`
    type($query) `,` type($key) `,` type($value) (`,` type($positions)^)? `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_QkvAttentionOp : Kiln_Op<"qkv_attention"> {
  let summary = "Attention over one input holding q, k and v side by side (fused)";
  let description = [{
    Made by `kiln-fuse-qkv` from the Q/K/V projections fused into one `kiln.linear`:
    `qkv` is [tokens, (num_heads + 2 num_kv_heads) * head_dim], the query heads, then
    the key heads, then the value heads of each token. With `rope` (the rotary
    parameters of `kiln.rope`: `theta`, `rope_type`, and for llama3 `factor`,
    `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`) q and
    k are rotated at `positions` inside the op (its `num_heads` is num_heads +
    num_kv_heads: q and k side by side). Otherwise as `kiln.attention`: with
    `cache_layer` the keys and values are written into the session's KV cache. With
    `kv_written` (`kiln-fuse-rope`) the producing `kiln.linear`'s `qkv` epilogue did
    both: q and k arrive rotated and the cache holds k and v; the op only attends.

    ```mlir
    %o = kiln.qkv_attention %qkv positions(%pos)
        {num_heads = 9 : i64, num_kv_heads = 3 : i64, head_dim = 64 : i64,
         scale = 1.250000e-01 : f64, causal, cache_layer = 0 : i64,
         rope = {num_heads = 12 : i64, head_dim = 64 : i64, theta = 1.000000e+04 : f64,
                 rope_type = "default"}}
        : tensor<?x960xf32>, tensor<?xi32> -> tensor<?x576xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$qkv, Optional<Kiln_Ids>:$positions,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, I64Attr:$head_dim,
                       F64Attr:$scale, UnitAttr:$causal,
                       OptionalAttr<I64Attr>:$cache_layer, OptionalAttr<DictionaryAttr>:$rope,
                       UnitAttr:$kv_written);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $qkv (`positions` `(` $positions^ `)`)? attr-dict `:` type($qkv) (`,` type($positions)^)?
    `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Vision
//===----------------------------------------------------------------------===//

def Kiln_PatchEmbedOp : Kiln_Op<"patch_embed", [Pure, AttrSizedOperandSegments]> {
  let summary = "Patch embedding: a stride-p convolution over the image";
  let description = [{
    `pixels` is one preprocessed image [channels, height, width]; `weight` is the
    convolution kernel [hidden, channels, p, p] with stride p and no padding
    ("valid"), `bias` optional [hidden]. The result is [(height/p)·(width/p),
    hidden], patches in row-major order. With `position` (a position embedding
    folded in by `kiln-fuse-residual`), row i of that table ([positions >= rows,
    hidden]) is added to row i in the product's epilogue. With `class` (CLIP's class
    embedding [hidden], a `kiln.class_token` folded in with its position embedding)
    the result is [1 + patches, hidden]: row 0 the class embedding, patch i row 1 + i.

    ```mlir
    %p = kiln.patch_embed %px, %w {patch_size = 14 : i64}
        : tensor<3x336x336xf32>, tensor<1024x3x14x14xf16> -> tensor<576x1024xf32>
    %q = kiln.patch_embed %px, %w, %b position(%t) {patch_size = 16 : i64}
        : tensor<3x512x512xf32>, tensor<768x3x16x16xf32>, tensor<768xf32> position tensor<1024x768xf32>
          -> tensor<1024x768xf32>
    %c = kiln.patch_embed %px, %w position(%t) class(%cls) {patch_size = 14 : i64}
        : tensor<3x336x336xf32>, tensor<1024x3x14x14xf16> position tensor<577x1024xf32>
          class tensor<1024xf32> -> tensor<577x1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$pixels, Kiln_Weight:$weight,
                       Optional<Kiln_Weight>:$bias, Optional<Kiln_Weight>:$position,
                       Optional<Kiln_Weight>:$class_embedding, I64Attr:$patch_size);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $pixels `,` $weight (`,` $bias^)? (`position` `(` $position^ `)`)? (`class` `(` $class_embedding^ `)`)?
    attr-dict `:` type($pixels) `,` type($weight) (`,` type($bias)^)? (`position` type($position)^)?
    (`class` type($class_embedding)^)? `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_ClassTokenOp : Kiln_Op<"class_token", [Pure]> {
  let summary = "Prepend a learned class embedding (CLIP's [CLS])";
  let description = [{
    `[patches, hidden]` → `[1 + patches, hidden]` with `class_embedding` as row 0.

    ```mlir
    %c = kiln.class_token %p, %cls : tensor<576x1024xf32>, tensor<1024xf16> -> tensor<577x1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$class_embedding);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $class_embedding attr-dict `:` type($input) `,` type($class_embedding)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_PositionEmbeddingOp : Kiln_Op<"position_embedding", [Pure]> {
  let summary = "Add learned absolute position embeddings";
  let description = [{
    Adds row i of `table` ([positions, hidden]) to row i of `input`; the input may
    not have more rows than the table.

    ```mlir
    %y = kiln.position_embedding %x, %t
        : tensor<577x1024xf32>, tensor<577x1024xf16> -> tensor<577x1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, Kiln_Weight:$table);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = [{
    $input `,` $table attr-dict `:` type($input) `,` type($table) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_SliceRowsOp : Kiln_Op<"slice_rows", [Pure]> {
  let summary = "Take a contiguous range of rows";
  let description = [{
    Rows [start, start + size) of a [rows, hidden] tensor; LLaVA uses it to drop the
    class token (vision_feature_select_strategy = "default").

    ```mlir
    %y = kiln.slice_rows %x {start = 1 : i64} : tensor<577x1024xf32> -> tensor<576x1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, I64Attr:$start);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_ConcatOp : Kiln_Op<"concat", [Pure]> {
  let summary = "Concatenate along the last dimension";
  let description = [{
    Joins [rows, d_i] tensors into [rows, sum(d_i)]; LLaVA uses it when
    `vision_feature_layer` lists several hidden states.

    ```mlir
    %y = kiln.concat %a, %b : tensor<576x1024xf32>, tensor<576x1024xf32> -> tensor<576x2048xf32>
    ```
  }];
  let arguments = (ins Variadic<Kiln_Activation>:$inputs);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_SelectTokensOp : Kiln_Op<"select_tokens", [Pure]> {
  let summary = "Keep the best-scoring rows, in order (visual-token pruning)";
  let description = [{
    Scores every row of `input` ([tokens, D], an image's tokens after the
    projector) and keeps the `keep` best, in their original order (ties: the
    earlier row). `score`: `norm`, the row's L2 norm, or `distinct`, one minus the
    cosine similarity of the row to the mean of all rows (tokens unlike the
    image's background). Inserted by kiln-prune-visual-tokens; at run time a
    session may keep fewer rows than `keep` (kiln_session_options_t.image_tokens).
    With `original_positions`, the decoder gives each kept token the RoPE position
    it has unpruned (the image's first position plus its row in `input`) and the
    text after the image the positions it has unpruned; without it, the kept
    tokens take consecutive positions.

    ```mlir
    %y = kiln.select_tokens %x {keep = 8 : i64, score = "distinct"} : tensor<16x64xf32> -> tensor<8x64xf32>
    %z = kiln.select_tokens %x {keep = 8 : i64, score = "distinct", original_positions} : tensor<16x64xf32> -> tensor<8x64xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, I64Attr:$keep, StrAttr:$score, UnitAttr:$original_positions);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_PixelShuffleOp : Kiln_Op<"pixel_shuffle", [Pure]> {
  let summary = "Space-to-depth over the patch grid (Idefics3 connector)";
  let description = [{
    Reshapes `[s·s, d]` patch features (an s×s grid, row-major) into
    `[(s/r)·(s/r), d·r·r]` exactly as `Idefics3Connector.pixel_shuffle` with
    `scale_factor = r`: each output token concatenates an r×r block of patches, in
    the order that function's view/permute sequence produces.

    ```mlir
    %y = kiln.pixel_shuffle %x {scale_factor = 4 : i64} : tensor<1024x768xf32> -> tensor<64x12288xf32>
    ```
  }];
  let arguments = (ins Kiln_Activation:$input, I64Attr:$scale_factor);
  let results = (outs Kiln_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

#endif // KILN_DIALECT_KILNOPS_TD
