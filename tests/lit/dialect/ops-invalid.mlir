// RUN: kiln-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'kiln.weight' op weight 'w': source size 100 bytes does not match 'tensor<4x8xf32>' (128 bytes)}}
kiln.weight @w : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 100, dtype = "F32"> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{'kiln.weight' op weight 'w': source dtype BF16 does not match element type 'f32'}}
kiln.weight @w : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "BF16"> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{'kiln.weight' op weight 'w' must have a static shape}}
kiln.weight @w : tensor<?x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{'kiln.weight' op weight 'w': source offset + size overflows}}
kiln.weight @w : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 18446744073709551600, size = 128, dtype = "F32"> as #kiln.encoding<f32>

// -----

func.func @f() -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.weight_ref' op 'missing' does not name a kiln.weight}}
  %w = kiln.weight_ref @missing : tensor<4xf32>
  return %w : tensor<4xf32>
}

// -----

kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<f32>
func.func @f() -> tensor<8xf32> {
  // expected-error @+1 {{'kiln.weight_ref' op type 'tensor<8xf32>' does not match the type 'tensor<4xf32>' of weight 'w'}}
  %w = kiln.weight_ref @w : tensor<8xf32>
  return %w : tensor<8xf32>
}

// -----

func.func @f(%t: tensor<64x16xf32>, %ids: tensor<?xi32>) {
  // expected-error @+1 {{'kiln.embedding' op result type 'tensor<?x8xf32>' does not match the expected shape [?x16]}}
  %e = kiln.embedding %t, %ids : tensor<64x16xf32>, tensor<?xi32> -> tensor<?x8xf32>
  return
}

// -----

func.func @f(%e: tensor<?x16xf32>, %ids: tensor<?xi32>, %img: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.merge_image_tokens' op image hidden size (8) does not match text hidden size (16)}}
  %m = kiln.merge_image_tokens %e, %ids, %img {image_token_id = 3 : i64} : tensor<?x16xf32>, tensor<?xi32>, tensor<4x8xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %w: tensor<32x8xf32>) {
  // expected-error @+1 {{'kiln.linear' op input features (16) does not match weight in_features (8)}}
  %y = kiln.linear %x, %w : tensor<?x16xf32>, tensor<32x8xf32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %w: tensor<32x16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{'kiln.linear' op bias length (16) does not match weight out_features (32)}}
  %y = kiln.linear %x, %w, %b : tensor<?x16xf32>, tensor<32x16xf32>, tensor<16xf32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %w: tensor<64x16xf32>) {
  // expected-error @+1 {{'kiln.lm_head' op result type 'tensor<?x32xf32>' does not match the expected shape [?x64]}}
  %y = kiln.lm_head %x, %w : tensor<?x16xf32>, tensor<64x16xf32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%a: tensor<4x16xf32>, %b: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.add' op requires the same type for all operands and results}}
  %y = "kiln.add"(%a, %b) : (tensor<4x16xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @f(%a: tensor<4x16xi32>) {
  // expected-error @+1 {{'kiln.mul' op operand #0 must be ranked tensor of 32-bit float values}}
  %y = "kiln.mul"(%a, %a) : (tensor<4x16xi32>, tensor<4x16xi32>) -> tensor<4x16xi32>
  return
}

// -----

func.func @f(%a: tensor<4x16xf32>) {
  // expected-error @+1 {{expected '<'}}
  %y = kiln.activation %a {kind = #kiln.activation} : tensor<4x16xf32>
  return
}

// -----

func.func @f(%a: tensor<4x16xf32>) {
  // expected-error @+2 {{expected ::kiln::ActivationKind to be one of: silu, gelu, gelu_tanh, quick_gelu, relu}}
  // expected-error @+1 {{failed to parse Kiln_ActivationAttr parameter 'value'}}
  %y = kiln.activation %a {kind = #kiln.activation<swiglu>} : tensor<4x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x16xf32>) {
  // expected-error @+1 {{'kiln.gated_mlp' op down in_features (16) does not match intermediate size (32)}}
  %y = kiln.gated_mlp %x, %g, %g, %d {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %r: tensor<2x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x32xf32>) {
  // expected-error @+1 {{'kiln.moe' op top_k 3 must lie in [1, 2]}}
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %d) {top_k = 3 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %r: tensor<3x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x32xf32>) {
  // expected-error @+1 {{'kiln.moe' op router rows (3) does not match expert count (2)}}
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %d) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<3x16xf32>, (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %r: tensor<2x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x32xf32>) {
  // expected-error @+1 {{'kiln.moe' op expert_ids must be distinct and non-negative}}
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %d) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 1, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %r: tensor<2x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x32xf32>, %bad: tensor<16x16xf32>) {
  // expected-error @+1 {{'kiln.moe' op expert 5 down in_features (16) does not match intermediate size (32)}}
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %bad) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 5>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<16x32xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<4x8xf32>, %w: tensor<7xf32>) {
  // expected-error @+1 {{'kiln.rms_norm' op weight length (7) does not match the last dimension of the input (8)}}
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x8xf32>, tensor<7xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<4x8xf32>, %w: tensor<1x8xf32>) {
  // expected-error @+1 {{'kiln.rms_norm' op weight must have rank 1, got 2}}
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x8xf32>, tensor<1x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<4x8xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.rms_norm' op epsilon must be positive}}
  %y = kiln.rms_norm %x, %w {epsilon = 0.0 : f32} : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<4x8xf32>, %w: tensor<8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'kiln.layer_norm' op bias length (4) does not match the last dimension of the input (8)}}
  %y = kiln.layer_norm %x, %w, %b {epsilon = 1.0e-05 : f32} : tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %p: tensor<?xi32>) {
  // expected-error @+1 {{'kiln.rope' op needs num_heads >= 1 and an even head_dim, got 2 and 7}}
  %y = kiln.rope %x, %p {num_heads = 2 : i64, head_dim = 7 : i64, theta = 1.0e4 : f64} : tensor<?x16xf32>, tensor<?xi32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %p: tensor<?xi32>) {
  // expected-error @+1 {{'kiln.rope' op input width (16) does not match num_heads * head_dim (32)}}
  %y = kiln.rope %x, %p {num_heads = 4 : i64, head_dim = 8 : i64, theta = 1.0e4 : f64} : tensor<?x16xf32>, tensor<?xi32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %p: tensor<?xi32>) {
  // expected-error @+1 {{'kiln.rope' op rope_type "llama3" needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings}}
  %y = kiln.rope %x, %p {num_heads = 2 : i64, head_dim = 8 : i64, theta = 1.0e4 : f64, rope_type = "llama3", factor = 8.0 : f64} : tensor<?x16xf32>, tensor<?xi32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %p: tensor<?xi32>) {
  // expected-error @+1 {{'kiln.rope' op unsupported rope_type "yarn" (supported: default, llama3)}}
  %y = kiln.rope %x, %p {num_heads = 2 : i64, head_dim = 8 : i64, theta = 1.0e4 : f64, rope_type = "yarn"} : tensor<?x16xf32>, tensor<?xi32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%q: tensor<?x24xf32>, %k: tensor<?x16xf32>) {
  // expected-error @+1 {{'kiln.attention' op num_heads (3) must be a multiple of num_kv_heads (2)}}
  %y = kiln.attention %q, %k, %k {num_heads = 3 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64} : tensor<?x24xf32>, tensor<?x16xf32>, tensor<?x16xf32> -> tensor<?x24xf32>
  return
}

// -----

func.func @f(%q: tensor<?x32xf32>, %k: tensor<?x8xf32>) {
  // expected-error @+1 {{'kiln.attention' op key width (8) does not match num_kv_heads * head_dim (16)}}
  %y = kiln.attention %q, %k, %k {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64} : tensor<?x32xf32>, tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%q: tensor<?x32xf32>, %k: tensor<?x16xf32>) {
  // expected-error @+1 {{'kiln.attention' op a KV-cache attention (cache_layer) needs positions}}
  %y = kiln.attention %q, %k, %k {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64, causal, cache_layer = 0 : i64} : tensor<?x32xf32>, tensor<?x16xf32>, tensor<?x16xf32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%q: tensor<?x32xf32>, %k: tensor<?x16xf32>, %p: tensor<?xi32>) {
  // expected-error @+1 {{'kiln.attention' op a KV-cache attention (cache_layer) must be causal}}
  %y = kiln.attention %q, %k, %k positions(%p) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64, cache_layer = 0 : i64} : tensor<?x32xf32>, tensor<?x16xf32>, tensor<?x16xf32>, tensor<?xi32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%px: tensor<3x18x18xf32>, %w: tensor<16x3x4x4xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op image size 18x18 is not a multiple of patch_size 4}}
  %y = kiln.patch_embed %px, %w {patch_size = 4 : i64} : tensor<3x18x18xf32>, tensor<16x3x4x4xf32> -> tensor<16x16xf32>
  return
}

// -----

func.func @f(%px: tensor<1x16x16xf32>, %w: tensor<16x3x4x4xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op weight channels (3) does not match image channels (1)}}
  %y = kiln.patch_embed %px, %w {patch_size = 4 : i64} : tensor<1x16x16xf32>, tensor<16x3x4x4xf32> -> tensor<16x16xf32>
  return
}

// -----

func.func @f(%x: tensor<16x8xf32>, %c: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.class_token' op result type 'tensor<16x8xf32>' does not match the expected shape [17x8]}}
  %y = kiln.class_token %x, %c : tensor<16x8xf32>, tensor<8xf32> -> tensor<16x8xf32>
  return
}

// -----

func.func @f(%x: tensor<17x8xf32>, %t: tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.position_embedding' op input has 17 rows but the table only 16 positions}}
  %y = kiln.position_embedding %x, %t : tensor<17x8xf32>, tensor<16x8xf32> -> tensor<17x8xf32>
  return
}

// -----

func.func @f(%x: tensor<17x8xf32>) {
  // expected-error @+1 {{'kiln.slice_rows' op rows [2, 18) exceed the input's 17 rows}}
  %y = kiln.slice_rows %x {start = 2 : i64} : tensor<17x8xf32> -> tensor<16x8xf32>
  return
}

// -----

func.func @f(%x: tensor<15x8xf32>) {
  // expected-error @+1 {{'kiln.pixel_shuffle' op input rows (15) do not form a square patch grid}}
  %y = kiln.pixel_shuffle %x {scale_factor = 2 : i64} : tensor<15x8xf32> -> tensor<4x32xf32>
  return
}

// -----

func.func @f(%x: tensor<36x8xf32>) {
  // expected-error @+1 {{'kiln.pixel_shuffle' op scale_factor 4 does not divide the patch grid side 6}}
  %y = kiln.pixel_shuffle %x {scale_factor = 4 : i64} : tensor<36x8xf32> -> tensor<4x128xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>, %b: tensor<5x8xf32>) {
  // expected-error @+1 {{'kiln.concat' op input rows (5) does not match the first input's rows (4)}}
  %y = kiln.concat %a, %b : tensor<4x8xf32>, tensor<5x8xf32> -> tensor<4x16xf32>
  return
}

// -----

// Fusions (kiln-fuse-*): a norm prologue needs its weight and epsilon.
func.func @norm_without_weight(%x: tensor<?x16xf32>, %w: tensor<32x16xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'kiln.linear' op a rms norm prologue needs norm_weight and norm_epsilon}}
  %y = kiln.linear %x, %w {norm = "rms"} : tensor<?x16xf32>, tensor<32x16xf32> -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}

// -----

func.func @norm_kind(%x: tensor<?x16xf32>, %w: tensor<32x16xf32>, %n: tensor<16xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'kiln.linear' op norm must be "rms" or "layer", got "batch"}}
  %y = kiln.linear %x, %w norm(%n) {norm = "batch", norm_epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<32x16xf32> norm tensor<16xf32> -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}

// -----

func.func @layer_norm_without_bias(%x: tensor<?x16xf32>, %g: tensor<24x16xf32>, %d: tensor<16x24xf32>, %n: tensor<16xf32>) -> tensor<?x16xf32> {
  // expected-error @+1 {{'kiln.gated_mlp' op a layer norm prologue needs norm_bias}}
  %y = kiln.gated_mlp %x, %g, %g, %d norm(%n) {activation = #kiln.activation<silu>, norm = "layer", norm_epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<24x16xf32>, tensor<24x16xf32>, tensor<16x24xf32> norm tensor<16xf32> -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

func.func @norm_weight_length(%x: tensor<?x16xf32>, %w: tensor<32x16xf32>, %n: tensor<8xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'kiln.linear' op norm_weight length (8) does not match the last dimension of the input (16)}}
  %y = kiln.linear %x, %w norm(%n) {norm = "rms", norm_epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<32x16xf32> norm tensor<8xf32> -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}

// -----

func.func @residual_shape(%x: tensor<?x16xf32>, %w: tensor<32x16xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'kiln.linear' op residual type 'tensor<?x16xf32>' differs from the result type 'tensor<?x32xf32>'}}
  %y = kiln.linear %x, %w residual(%x) : tensor<?x16xf32>, tensor<32x16xf32> residual tensor<?x16xf32> -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}

// -----

func.func @qkv_width(%qkv: tensor<?x48xf32>, %pos: tensor<?xi32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'kiln.qkv_attention' op qkv width (48) does not match (num_heads + 2 num_kv_heads) * head_dim (64)}}
  %o = kiln.qkv_attention %qkv positions(%pos) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64, causal, cache_layer = 0 : i64} : tensor<?x48xf32>, tensor<?xi32> -> tensor<?x32xf32>
  return %o : tensor<?x32xf32>
}

// -----

func.func @qkv_rope_heads(%qkv: tensor<?x64xf32>, %pos: tensor<?xi32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'kiln.qkv_attention' op rope must rotate num_heads + num_kv_heads = 6 heads of head_dim 8}}
  %o = kiln.qkv_attention %qkv positions(%pos) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64, causal, cache_layer = 0 : i64, rope = {num_heads = 4 : i64, head_dim = 8 : i64, theta = 1.0e4 : f64}} : tensor<?x64xf32>, tensor<?xi32> -> tensor<?x32xf32>
  return %o : tensor<?x32xf32>
}

// -----

func.func @qkv_positions(%qkv: tensor<5x48xf32>, %pos: tensor<5xi32>) -> tensor<5x16xf32> {
  // expected-error @+1 {{'kiln.qkv_attention' op positions are needed by, and only by, a cache_layer or a rope}}
  %o = kiln.qkv_attention %qkv positions(%pos) {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64} : tensor<5x48xf32>, tensor<5xi32> -> tensor<5x16xf32>
  return %o : tensor<5x16xf32>
}

// -----

// Gate and up fused into one weight (kiln-fuse-gate-up): gate_up_block says so, and
// the weight holds both.
func.func @f(%x: tensor<?x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x16xf32>) {
  // expected-error @+1 {{'kiln.gated_mlp' op has an up weight and gate_up_block: gate_up_block says the gate weight interleaves gate and up}}
  %y = kiln.gated_mlp %x, %g, %g, %d {activation = #kiln.activation<silu>, gate_up_block = 16 : i64} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x16xf32>) {
  // expected-error @+1 {{'kiln.gated_mlp' op has no up weight and no gate_up_block}}
  %y = kiln.gated_mlp %x, %g, %d {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x32xf32>) {
  // expected-error @+1 {{'kiln.gated_mlp' op gate/up rows (32) does not match 2 x down in_features (64)}}
  %y = kiln.gated_mlp %x, %g, %d {activation = #kiln.activation<silu>, gate_up_block = 16 : i64} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<16x32xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%x: tensor<?x16xf32>, %g: tensor<32x16xf32>, %d: tensor<16x16xf32>) {
  // expected-error @+1 {{'kiln.gated_mlp' op gate_up_block 0 must lie in [1, 256]}}
  %y = kiln.gated_mlp %x, %g, %d {activation = #kiln.activation<silu>, gate_up_block = 0 : i64} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @f(%px: tensor<3x16x16xf32>, %w: tensor<16x3x4x4xf32>, %t: tensor<8x16xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op position table has 8 rows for 16 patches}}
  %y = kiln.patch_embed %px, %w position(%t) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> position tensor<8x16xf32> -> tensor<16x16xf32>
  return
}

// -----

func.func @f(%px: tensor<3x16x16xf32>, %w: tensor<16x3x4x4xf32>, %t: tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op position width (8) does not match hidden size (16)}}
  %y = kiln.patch_embed %px, %w position(%t) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> position tensor<16x8xf32> -> tensor<16x16xf32>
  return
}

// -----

func.func @f(%px: tensor<3x16x16xf32>, %w: tensor<16x3x4x4xf32>, %t: tensor<16x16xf32>, %c: tensor<16xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op position table has 16 rows for 17 rows (patches and the class token)}}
  %y = kiln.patch_embed %px, %w position(%t) class(%c) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> position tensor<16x16xf32> class tensor<16xf32> -> tensor<17x16xf32>
  return
}

// -----

func.func @f(%px: tensor<3x16x16xf32>, %w: tensor<16x3x4x4xf32>, %c: tensor<16xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op a class embedding comes with a position table}}
  %y = kiln.patch_embed %px, %w class(%c) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> class tensor<16xf32> -> tensor<17x16xf32>
  return
}

// -----

func.func @f(%px: tensor<3x16x16xf32>, %w: tensor<16x3x4x4xf32>, %t: tensor<17x16xf32>, %c: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.patch_embed' op class embedding length (8) does not match hidden size (16)}}
  %y = kiln.patch_embed %px, %w position(%t) class(%c) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> position tensor<17x16xf32> class tensor<8xf32> -> tensor<17x16xf32>
  return
}

// -----

func.func @f(%x: tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.select_tokens' op keep 20 must lie in [1, 16]}}
  %y = kiln.select_tokens %x {keep = 20 : i64, score = "norm"} : tensor<16x8xf32> -> tensor<20x8xf32>
  return
}

// -----

func.func @f(%x: tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.select_tokens' op score must be norm or distinct, got 'attention'}}
  %y = kiln.select_tokens %x {keep = 4 : i64, score = "attention"} : tensor<16x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.select_tokens' op result rows (6) does not match keep (4)}}
  %y = kiln.select_tokens %x {keep = 4 : i64, score = "norm"} : tensor<16x8xf32> -> tensor<6x8xf32>
  return
}

// -----

func.func @f(%x: tensor<1x16xf32>, %w: tensor<64x16xf32>, %pos: tensor<1xi32>) {
  // expected-error @+1 {{'kiln.linear' op positions come with, and only with, a qkv epilogue}}
  %y = kiln.linear %x, %w positions(%pos) : tensor<1x16xf32>, tensor<64x16xf32> positions tensor<1xi32> -> tensor<1x64xf32>
  return
}

// -----

func.func @f(%x: tensor<1x16xf32>, %w: tensor<48x16xf32>, %pos: tensor<1xi32>) {
  // expected-error @+1 {{'kiln.linear' op out_features (48) does not match (num_heads + 2 num_kv_heads) * head_dim (64)}}
  %y = kiln.linear %x, %w positions(%pos) {qkv = {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, cache_layer = 0 : i64}} : tensor<1x16xf32>, tensor<48x16xf32> positions tensor<1xi32> -> tensor<1x48xf32>
  return
}

// -----

func.func @f(%x: tensor<1x16xf32>, %w: tensor<64x16xf32>, %pos: tensor<1xi32>) {
  // expected-error @+1 {{'kiln.linear' op a qkv epilogue rotates (rope), writes the KV cache (cache_layer), or both}}
  %y = kiln.linear %x, %w positions(%pos) {qkv = {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64}} : tensor<1x16xf32>, tensor<64x16xf32> positions tensor<1xi32> -> tensor<1x64xf32>
  return
}

// -----

func.func @f(%qkv: tensor<1x64xf32>, %pos: tensor<1xi32>) {
  // expected-error @+1 {{'kiln.qkv_attention' op kv_written needs its q|k|v from a kiln.linear whose qkv epilogue has its heads and cache_layer}}
  %a = kiln.qkv_attention %qkv positions(%pos) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35 : f64, causal, cache_layer = 0 : i64, kv_written} : tensor<1x64xf32>, tensor<1xi32> -> tensor<1x32xf32>
  return
}
