//===- Passes.td - Kiln passes (the one registry) ----------*- tablegen -*-===//
//
// Every compiler pass of Kiln, each a kiln-opt flag of the form kiln-<verb>[-<noun>].
//
//===----------------------------------------------------------------------===//

#ifndef KILN_PASSES_TD
#define KILN_PASSES_TD

include "mlir/Pass/PassBase.td"

def KilnSelectKernels : Pass<"kiln-select-kernels", "::mlir::ModuleOp"> {
  let summary = "Bind every op of every stage to a kernel of the target";
  let description = [{
    Annotates each kiln op inside a stage function with `kiln.kernel`, the name of
    the kernel (formats/kernels.def) that runs it on the target. The choice is made
    at compile time, so that no op falls back silently at run time: an op whose
    weight encoding no kernel of the target accepts is an error naming the op.
    Of the kernels of formats/kernels.def that run the op's kind, read its
    weights' encodings and need no CPU feature the target lacks, the most
    specialised (most CPU features) is chosen, the first in table order among
    equals; every binding is reported as a remark (kernel, ISA, features), and a
    binding to a portable reference kernel says so. The artifact's required CPU
    features are derived from the bound kernels. The target defaults to the host
    with the CPU features it detects; `target=portable` binds the reference
    kernels. Generated kernels (`kernels=generated`, the default) rank above the
    hand-written ones, so that every op the generator serves runs code generated
    for the model (an op bound to a hand-written kernel then says why in its
    remark); `kernels=hand-written` ranks the hand-written kernels for the
    target's features first, for comparisons.

    No fallback: on a CPU target (anything but `portable`), an op of a kind that
    has generated or hand-written kernels must be bound to one; when none
    qualifies (a weight encoding the generator does not read on that target, a
    missing CPU feature) it is an error naming the op and why, unless the op's
    name matches `allow-portable-ops` (then a remark says it runs the reference
    kernel). Kinds that only the runtime's copies run (slices, concatenation,
    class token, image-token merge, pixel shuffle) have no such kernels.

    Example:

    ```mlir
    %y = kiln.linear %x, %w {kiln.kernel = "ref_linear"} : ...
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"\"",
           "host (default: this machine, detected CPU features), portable, or a triple; an unknown triple is an error">,
    Option<"cpuFeatures", "cpu-features", "std::string", /*default=*/"\"\"",
           "CPU features the target has, e.g. +avx2,+fma or +dotprod,+i8mm">,
    Option<"allowPortableOps", "allow-portable-ops", "std::string", /*default=*/"\"\"",
           "ops (a regex over the whole op name) that may run a portable reference kernel on a CPU target">,
    Option<"kernels", "kernels", "std::string", /*default=*/"\"generated\"",
           "generated (the default: kernels generated for the model first; hand-written ones only for ops the "
           "generator cannot serve, with a remark) or hand-written (hand-written kernels for the target's "
           "features first, then generated ones; for comparisons)">,
  ];
}

def KilnPackWeights : Pass<"kiln-pack-weights", "::mlir::ModuleOp"> {
  let summary = "Store weights in the packed layouts of the kernels that read them";
  let description = [{
    Runs after `kiln-select-kernels`. A weight whose every reader is bound to a
    kernel that reads a packed layout is given that layout (`#kiln.layout`); the
    artifact writer rearranges its bytes at compile time, and the runtime maps them
    as they are (no repacking at load).

    Five layouts (formats/encoding.h): `int4_p16k8` and `int8_p16k4`, for
    symmetric int4 (group a multiple of 8) and int8 (input dimension a multiple of
    4) weights of the generated matmuls (linear, LM head, gated MLP, mixture of
    experts, patch embedding), with int8 per-token activations (W4A8, W8A8) or
    float ones (W4A16, W8A16): rows in panels of 16, for each step of 8 (int4, the
    two halves in the low and high nibbles) or 4 (int8) columns each row's 4 bytes,
    so that one 64-byte load is a panel's operand of a 4-element dot product per
    output channel against a row's broadcast activations, or holds 8 or 4 columns
    of a panel that a shift (and a mask) separate; `panel16`, for f32, f16, bf16 and
    fp8 matmul weights multiplied with float activations: rows in panels of 16
    stored column by column, so that the kernel multiplies a broadcast activation
    by a panel's column; `int4_p128k4`, for symmetric int4 weights (group a
    multiple of 4) that only generated W4A8 matmuls read on a target with SME2:
    rows in panels of 128, for each step of 4 columns each row's 4 codes as
    consecutive nibbles, which LUTI4 expands two vectors at a time into signed
    operands at any streaming vector length (it is tried first); `int4_p16k16`,
    for symmetric int4 weights (group a multiple of 16, rows a multiple of 16)
    that only generated W4A8 matmuls read on a target with i8mm (tried next): rows
    in panels of 16, for each step of 16 columns each channel pair's 16 bytes
    together, the low nibbles the first 8 columns, so that a mask and a shift give
    SMMLA's 8 x 2 operands of two steps without zips. The generated
    embedding gather reads `int4_p16k8` too, so
    that an embedding table tied to a W4A8 or W4A16 LM head is packed for the head;
    a weight that only gathers read,
    or that another kernel also reads (a float table tied to the LM head, an op
    allowed onto the reference kernels), stays row major.

    Example:

    ```mlir
    kiln.weight @w : tensor<64x64xf32> from ... as #kiln.encoding<int4, group_size = 32, activation = int8_per_token>
        layout #kiln.layout<int4_p16k8>
    ```
  }];
}

def KilnPlanMemory : Pass<"kiln-plan-memory", "::mlir::ModuleOp"> {
  let summary = "Place every activation of every stage in a static arena";
  let description = [{
    Computes, for each stage function, the size of every op result at the largest
    token count the stage is planned for (`max-prefill-tokens` for the dynamic token
    dimension of prefill), its lifetime in program order, and an offset in the
    stage's arena such that buffers alive at the same time never overlap. Buffers
    are 64-byte aligned and reused as soon as their last reader has run; element-wise
    ops and normalisations write in place over an input that dies with them, and a
    matmul with a fused residual over that residual.

    Results: `kiln.offset` on each op (byte offset in the arena) or `kiln.output`
    (the index of the stage result it is written to), `kiln.arena_bytes` on each
    stage function and `kiln.max_prefill_tokens` on the module.

    The KV cache is a session's, sized by its context at run time; its encoding is
    decided here (`kv-cache`: f32, f16, int8 or int4) and recorded on the module as
    `kiln.kv_cache = #kiln.encoding<...>`: int8 and int4 with one scale per 32
    channels of a position's keys or values (per head when head_dim is not a multiple
    of 32).
  }];
  let options = [
    Option<"maxPrefillTokens", "max-prefill-tokens", "int64_t", /*default=*/"512",
           "Token bound of one prefill step (longer prompts are chunked)">,
    Option<"kvCache", "kv-cache", "std::string", /*default=*/"\"f32\"",
           "Encoding of the KV cache: f32, f16, int8 or int4">,
  ];
}

def KilnPruneExperts : Pass<"kiln-prune-experts", "::mlir::ModuleOp"> {
  let summary = "Remove the mixture-of-experts experts calibration shows are least used";
  let description = [{
    Reads the routing statistics calibration attaches to each MoE router weight
    (`kiln.routing`: the `tokens` routed, and per expert, in the order of the
    op's operands, how many tokens `selected` it among their top k and the
    `mass`, the sum of the routing weights it received) and removes, in every
    layer, the experts with the least mass (ties: fewer selections, then the
    later expert). `prune` says how many: `N` experts per layer, a fraction
    `0.25` or a percentage `25%` of each layer's experts (rounded down).

    The router loses the pruned experts' rows (a `#kiln.slice`/`#kiln.concat`
    of the original, evaluated by the artifact writer), every `kiln.moe` that
    reads it loses their gate, up and down weights and `expert_ids` their
    entries, and weights no op reads any more leave the module, so the artifact
    shrinks. With `normalize_top_k` (Mixtral's renormalised top-k) this is
    exactly "never route to them": the kept experts' routing weights are a
    softmax over the chosen logits only. A router whose weights are not
    renormalised is left alone with a remark (its softmax would change).

    With `merge`, the chosen experts are merged instead: each into the kept
    expert whose weights are most similar (`kiln.routing`'s `similarity`, the
    cosine of the experts' gate, up and down weights as one vector, which
    calibration measures), if that similarity reaches `merge-min-similarity`
    (else it is removed as above). The kept expert's gate, up and down become the
    mean of its group's (`#kiln.weighted_sum`), the router keeps the merged
    experts' rows, and their operands are the kept one's: a token routed to a
    merged expert gets the merged weights with that expert's routing weight. The
    merged experts' weights leave the module, so the artifact shrinks as much as
    by removing them; the compute per token is unchanged. Routing weights that
    are not renormalised do not stop a merge (no row goes).

    Each pruned expert is named in a remark with its statistics, and recorded
    on the router (`kiln.pruned_experts`: `expert_ids`, `selected`, `mass`,
    `tokens`, and with `merge` `merged_into`) for the precision report. A router without statistics, or a
    pruning that would leave fewer experts than `top_k`, is an error naming the
    weight.

    ```mlir
    kiln.weight @router : tensor<4x16xf32> from ... as #kiln.encoding<f32>
        {kiln.routing = {tokens = 100 : i64, selected = array<i64: 90, 5, 80, 25>,
                         mass = array<f64: 60.0, 2.0, 30.0, 8.0>}}
    // kiln-prune-experts{prune=1} -> expert 1 goes: the router keeps rows 0, 2, 3
    kiln.weight @router : tensor<3x16xf32> from #kiln.concat<axis = 0, [
        #kiln.slice<..., offsets = [0, 0], sizes = [1, 16]>,
        #kiln.slice<..., offsets = [2, 0], sizes = [2, 16]>]> as #kiln.encoding<f32>
    ```
  }];
  let options = [
    Option<"prune", "prune", "std::string", /*default=*/"\"\"",
           "Experts to remove per layer: a count (2), a fraction (0.25) or a percentage (25%)">,
    Option<"merge", "merge", "bool", /*default=*/"false",
           "Merge each chosen expert into its most similar kept expert instead of removing it">,
    Option<"mergeMinSimilarity", "merge-min-similarity", "double", /*default=*/"0.5",
           "With merge: the cosine similarity a kept expert needs to take a chosen one; below it, removed">,
  ];
}

def KilnPruneVisualTokens : Pass<"kiln-prune-visual-tokens", "::mlir::ModuleOp"> {
  let summary = "Keep only the best-scoring image tokens for the decoder";
  let description = [{
    Ends the projector stage with a `kiln.select_tokens` that scores its image
    tokens and keeps the `keep` best in their original order: a count (`72`), a
    fraction (`0.5`) or a percentage (`50%`) of the projector's tokens, rounded
    down. The module's image configuration follows (`image_tokens`), so the prompt
    holds as many image placeholders as tokens kept, and the decoder's prefill and
    KV cache see only those. `score`: `distinct` (the default: one minus the cosine
    similarity of a token to the image's mean token, which ranks tokens that differ
    from the background first) or `norm` (the token's L2 norm). Works for every
    layout that has a projector stage (LLaVA's MLP, Idefics3's pixel shuffle and
    linear). Keeping all tokens is a no-op (remark); pruning twice selects once,
    from the original tokens. At run time a session may keep fewer
    (`kiln_session_options_t.image_tokens`, `kiln-run --image-tokens`).
    `positions`: `original` (the default: each kept token keeps the RoPE position it
    has unpruned, and the text after the image too, so the gaps of the removed
    tokens stay and the decoder sees every token where it saw it in training) or
    `consecutive` (the kept tokens take consecutive positions, for a model trained
    with pruned pictures that way).

    ```mlir
    func.func @projector(%x: tensor<16x32xf32>) -> tensor<8x64xf32> ... {
      ...
      %t = kiln.select_tokens %p {keep = 8 : i64, score = "distinct"} : tensor<16x64xf32> -> tensor<8x64xf32>
      return %t : tensor<8x64xf32>
    }
    ```
  }];
  let options = [
    Option<"keep", "keep", "std::string", /*default=*/"\"\"",
           "Image tokens to keep per image: a count (72), a fraction (0.5) or a percentage (50%)">,
    Option<"score", "score", "std::string", /*default=*/"\"distinct\"",
           "How tokens are ranked: distinct (unlike the image's mean token) or norm (L2 norm)">,
    Option<"positions", "positions", "std::string", /*default=*/"\"original\"",
           "RoPE positions of the kept tokens: original (those they have unpruned) or consecutive">,
  ];
}

def KilnAssignPrecision : Pass<"kiln-assign-precision", "::mlir::ModuleOp"> {
  let summary = "Choose the storage encoding of every weight under a memory budget";
  let description = [{
    Picks one encoding per weight so that the weights fit `memory-budget` bytes (or
    `bits-per-weight` on average) with the least total sensitivity: a
    multiple-choice knapsack over each weight's candidates, solved by Lagrangian
    relaxation and then greedily refined with the budget left over.

    A weight's candidates and their measured sensitivities come from its
    `kiln.sensitivity` attribute (`{label = KL, ...}`, written by calibration); its
    checkpoint encoding is always a candidate, with sensitivity 0. Weights without
    the attribute keep their encoding. `precision` overrides, `REGEX=ENCODING` in
    the manner of llama.cpp's --tensor-type, fix the encoding of every weight whose
    name the regex matches (the first matching override wins).

    Every decision is reported as a remark on its weight; a budget that even the
    smallest candidates cannot meet is an error that states the smallest budget
    that would fit.

    ```mlir
    kiln.weight @w : tensor<64x64xf32> from #kiln.source<...> as #kiln.encoding<f32>
        {kiln.sensitivity = {int8 = 1.0e-05 : f64, int4_g32 = 2.0e-03 : f64}}
    // kiln-assign-precision{memory-budget=9000} ->
    kiln.weight @w : tensor<64x64xf32> from #kiln.source<...> as #kiln.encoding<int8> ...
    ```
  }];
  let options = [
    Option<"memoryBudget", "memory-budget", "std::string", /*default=*/"\"\"",
           "Weight bytes allowed: 1.2GB (10^9), 800MiB (2^20), or a number of bytes">,
    Option<"bitsPerWeight", "bits-per-weight", "double", /*default=*/"0.0",
           "Average bits per weight parameter, scales included (instead of a budget)">,
    ListOption<"precision", "precision", "std::string",
               "REGEX=ENCODING overrides, e.g. 'vision_tower.*=bf16'">,
  ];
}

//===----------------------------------------------------------------------===//
// Fusion (passes/fusion): fewer, larger kernels per layer. Each reports every
// fusion it makes or refuses, with the reason, as a remark.
//===----------------------------------------------------------------------===//

def KilnFuseQkv : Pass<"kiln-fuse-qkv", "::mlir::ModuleOp"> {
  let summary = "Fuse the Q, K and V projections and their attention";
  let description = [{
    For every `kiln.attention` whose query, key and value are `kiln.linear`s of one
    input (the query and key possibly through `kiln.rope`s at the attention's
    positions), read by nothing else: one `kiln.linear` over a weight concatenating
    the three (a `#kiln.concat` along rows, evaluated by the artifact writer, named
    like the Q projection with `q_proj` -> `qkv_proj`; biases likewise), and one
    `kiln.qkv_attention` that reads q, k and v side by side from its output and
    rotates q and k itself. Refused, with a remark saying why, when the three
    weights were assigned different encodings (the precision assignment is kept),
    when only some have biases, or when another op reads a projection.

    ```mlir
    %q = kiln.linear %h, %wq ...   %k = kiln.linear %h, %wk ...   %v = kiln.linear %h, %wv ...
    %qr = kiln.rope %q, %pos ...   %kr = kiln.rope %k, %pos ...
    %a = kiln.attention %qr, %kr, %v positions(%pos) {...}
    // ->
    %qkv = kiln.linear %h, %wqkv : ... -> tensor<?x128xf32>
    %a = kiln.qkv_attention %qkv positions(%pos) {..., rope = {num_heads = 6 : i64, ...}}
    ```
  }];
}

def KilnFuseRope : Pass<"kiln-fuse-rope", "::mlir::ModuleOp"> {
  let summary = "Rotate q and k and write the KV cache in the q|k|v product's epilogue";
  let description = [{
    For every `kiln.qkv_attention` with a `rope` or a `cache_layer` whose q|k|v is a
    `kiln.linear` read by nothing else (no residual, no activation): the rotation
    and the KV-cache write move into that linear's epilogue (its `qkv` attribute, the
    attention's positions as its `positions` operand): each thread rotates the q and
    k heads of its range of channels right after their product, and the op writes k
    and v into the cache before it returns. The attention gets `kv_written` and only
    attends. Refused, with a remark, when the positions are computed after the
    linear.

    ```mlir
    %qkv = kiln.linear %h, %wqkv : ...
    %a = kiln.qkv_attention %qkv positions(%pos) {cache_layer = 0 : i64, rope = {...}, ...}
    // ->
    %qkv = kiln.linear %h, %wqkv positions(%pos)
        {qkv = {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 16 : i64,
                cache_layer = 0 : i64, rope = {...}}} : ...
    %a = kiln.qkv_attention %qkv positions(%pos) {cache_layer = 0 : i64, kv_written, ...}
    ```
  }];
}

def KilnFuseGateUp : Pass<"kiln-fuse-gate-up", "::mlir::ModuleOp"> {
  let summary = "Fuse a gated MLP's gate and up projections into one matrix product";
  let description = [{
    Every `kiln.gated_mlp` with separate gate and up weights of one encoding
    becomes one over a weight interleaving their rows in blocks of `block` (128 by
    default; a `#kiln.concat` with that `block`, evaluated by the artifact writer,
    named like the gate's with `gate_proj` -> `gate_up_proj`): the runtime computes
    gate and up of the same channels in one product, and its epilogue writes
    act(gate) * up: one dispatch instead of three, and no buffer of up. Refused, with
    a remark saying why, when the two weights were assigned different encodings
    (the precision assignment is kept) or element types. Runs before
    `kiln-fuse-residual` and `kiln-fuse-norm`, which keep the fused form.

    ```mlir
    %y = kiln.gated_mlp %x, %g, %u, %d {activation = #kiln.activation<silu>} : ...
    // ->
    %y = kiln.gated_mlp %x, %gu, %d {activation = #kiln.activation<silu>, gate_up_block = 128 : i64} : ...
    ```
  }];
  let options = [
    Option<"block", "block", "int64_t", /*default=*/"128",
           "Rows of gate, then of up, per interleaved block, 1 to 256 (a multiple of 8 keeps the "
           "product's ranges on the packed panels of 16; larger blocks: fewer epilogue calls)">,
  ];
}

def KilnFuseNorm : Pass<"kiln-fuse-norm", "::mlir::ModuleOp"> {
  let summary = "Fold a normalisation into the matmul that reads it";
  let description = [{
    A `kiln.rms_norm` or `kiln.layer_norm` whose only reader is a `kiln.linear` or
    `kiln.gated_mlp` (input 0) becomes that op's prologue (`norm`, `norm_weight`,
    `norm_bias`, `norm_epsilon`): the runtime normalises each row as it quantises
    it for int8 activations (or into the op's scratch for float ones), once for the
    gated MLP's gate and up. Run after `kiln-fuse-qkv`, which leaves the attention
    norm one reader. A norm with several readers, or read by another op kind, stays.

    ```mlir
    %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : ...
    %y = kiln.gated_mlp %h, %g, %u, %d {activation = #kiln.activation<silu>} : ...
    // ->
    %y = kiln.gated_mlp %x, %g, %u, %d norm(%n)
        {activation = #kiln.activation<silu>, norm = "rms", norm_epsilon = 1.0e-05 : f32} : ...
    ```
  }];
}

def KilnFuseActivation : Pass<"kiln-fuse-activation", "::mlir::ModuleOp"> {
  let summary = "Fold an activation into the linear that produces its input";
  let description = [{
    `kiln.activation` of a `kiln.linear` read only by it (a CLIP/SigLIP fc1, a gate
    projection with a bias) becomes the linear's `activation` epilogue: applied to
    each thread's range of the product right after it is computed. Runs before
    `kiln-fuse-residual`, whose residual is then added after the activation.

    ```mlir
    %h = kiln.linear %x, %w1, %b1 : ...
    %a = kiln.activation %h {kind = #kiln.activation<gelu_tanh>} : tensor<?x64xf32>
    // ->
    %a = kiln.linear %x, %w1, %b1 {activation = #kiln.activation<gelu_tanh>} : ...
    ```
  }];
}

def KilnFuseResidual : Pass<"kiln-fuse-residual", "::mlir::ModuleOp"> {
  let summary = "Fold a residual addition into the matmul that produces its summand";
  let description = [{
    `kiln.add %r, %m` where `%m` is a `kiln.linear`, `kiln.gated_mlp` or `kiln.moe`
    read only by the add becomes that op with `residual(%r)` (the epilogue): it
    writes `r + m` range by range, over `r`'s buffer when `r` dies there
    (kiln-plan-memory). Refused when the residual is also the matmul's input or is
    computed after it. Likewise a `kiln.position_embedding` of a `kiln.patch_embed`
    read only by it (SigLIP) becomes the patch embedding's `position` table, added
    to each patch's row in its epilogue; with a `kiln.class_token` between them
    (CLIP) the class embedding comes too, as row 0 of the patch embedding's result.

    ```mlir
    %o = kiln.linear %a, %wo : ...
    %x1 = kiln.add %x, %o : tensor<?x64xf32>
    // ->
    %x1 = kiln.linear %a, %wo residual(%x) : ...
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Test passes (kiln-opt only; library KilnTestPasses)
//===----------------------------------------------------------------------===//

def KilnTestSplitWeights : Pass<"kiln-test-split-weights", "::mlir::ModuleOp"> {
  let summary = "Test only: rewrite every weight as an equivalent weight expression";
  let description = [{
    Rewrites every weight whose values are one plain `#kiln.source` and whose type
    has rank 1 or 2 with every dimension at least 2 as an expression over that
    source with the same value: a [R, C] weight becomes the concatenation (axis 0)
    of its top rows, itself the concatenation (axis 1) of two slices, and its bottom
    rows, a slice transposed twice; a [N] weight the concatenation of two slices.
    An artifact written from the result must hold the same weight bytes as one
    written from the input (tests/e2e/test_weight_transforms.py).

    ```mlir
    kiln.weight @w : tensor<4x6xf32> from #kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32">
        as #kiln.encoding<f32>
    // ->
    kiln.weight @w : tensor<4x6xf32> from #kiln.concat<axis = 0, [
        #kiln.concat<axis = 1, [#kiln.slice<X, offsets = [0, 0], sizes = [2, 3]>,
                                #kiln.slice<X, offsets = [0, 3], sizes = [2, 3]>]>,
        #kiln.permute<#kiln.permute<#kiln.slice<X, offsets = [2, 0], sizes = [2, 6]>,
                                    dims = [1, 0]>, dims = [1, 0]>]>
        as #kiln.encoding<f32>
    // with X = #kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32", shape = [4, 6]>
    ```
  }];
}

#endif // KILN_PASSES_TD
