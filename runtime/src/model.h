// The loaded model behind kiln_model_t, and the session behind kiln_session_t.
#ifndef KILN_RUNTIME_SRC_MODEL_H_
#define KILN_RUNTIME_SRC_MODEL_H_

#include <string_view>

#include "code/elf_loader.h"
#include "formats/kiln_generated.h"
#include "image/preprocess.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"
#include "kv_cache.h"
#include "kv_pool.h"
#include "platform/platform.h"
#include "support/allocator.h"
#include "support/vec.h"
#include "thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace kiln::rt {

constexpr int kNumStages = 5;

// An op's calls and wall time (kiln_session_set_op_profiling).
struct OpTime {
  uint64_t calls;
  double ms;
};

// Where a stage input or output lives for one run.
struct Binding {
  void* data = nullptr;
  int64_t rows = 0;
};

}  // namespace kiln::rt

struct kiln_model_t {
  explicit kiln_model_t(const kiln_allocator_t* a) : allocator(a) {}

  kiln::rt::Allocator allocator;
  kiln::rt::FileMapping mapping;  // set when loaded from a file
  const uint8_t* data = nullptr;
  size_t size = 0;
  const kiln::fb::Model* fb = nullptr;
  const kiln::fb::Stage* stages[kiln::rt::kNumStages] = {};

  kiln::rt::Vec<kiln::rt::WeightView> weights;  // one per tensor
  kiln::rt::Tokenizer* tokenizer = nullptr;
  kiln::rt::Vec<std::string_view> vocab;        // views into the artifact, for the tokenizer
  kiln::rt::Vec<kiln::rt::TokenizerSpec::Merge> merges;
  kiln::rt::Vec<kiln::rt::TokenizerSpec::Added> added;

  bool multimodal = false;
  int64_t image_tokens_scored = 0;  // > 0: the projector selects its image tokens from this many (SelectTokens)
  bool image_positions_original = false;  // SelectTokens keeps them at their original positions
  kiln::rt::ImagePreprocessSpec preprocess;
  const char* image_token_text = "<image>";
  size_t image_token_text_len = 7;
  kiln::rt::Vec<int32_t> eos_ids;
  kiln_model_info_t info = {};
  // The code segment's kernels, and per stage and op the micro-kernels an op bound
  // to a generated kernel runs (null: its kernel's own).
  kiln::rt::CodeImage code;
  const kiln_kernel_library_t* kernel_library = nullptr;  // kiln_model_options_t.kernels
  const char* perf_map = nullptr;                         // kiln_model_options_t.perf_map (during the load)
  // kiln_model_options_t.memory_budget and the session it is for (checked at load).
  uint64_t memory_budget = 0;
  bool budget_session_given = false;
  kiln_session_options_t budget_session = {};
  // A paged KV cache (kiln_model_options_t.kv_pool_tokens / memory_budget): the pool
  // planned at load (kv_pool_blocks > 0) and created after the budget check; the
  // sessions whose encoding and group are the pool's take their blocks from it.
  int64_t kv_pool_tokens = 0;  // as asked
  bool pool_from_budget = true;  // without kv_pool_tokens, a budget sizes a pool (not under a shared budget)
  int32_t kv_block_tokens = 0;
  int32_t kv_pool_blocks = 0;
  int32_t kv_block_shift = 0;
  uint8_t kv_pool_encoding = 0;
  uint32_t kv_pool_group = 0;
  kiln::rt::KvPool* kv_pool = nullptr;
  uint64_t kv_pool_allocated = 0;  // the model allocator's bytes of the pool
  kiln::rt::Vec<kiln::rt::UkernelSet> generated_uk;
  kiln::rt::Vec<const kiln::rt::UkernelSet*> op_uk[kiln::rt::kNumStages];
  // op_uk as loaded: a generated kernel is specialised to its weights' stored
  // encodings, so an op reading a weight overridden for calibration runs its
  // kernel's own micro-kernels (op_uk null) until the weight is restored.
  kiln::rt::Vec<const kiln::rt::UkernelSet*> op_uk_loaded[kiln::rt::kNumStages];
  // kiln_model_set_pressure: the level of each kiln_pressure_kind_t, and a count of
  // changes the sessions compare with the one they applied.
  std::atomic<int32_t> pressure[3] = {};
  std::atomic<uint32_t> pressure_epoch{0};
};

struct kiln_session_t {
  explicit kiln_session_t(kiln_model_t* m, const kiln_allocator_t* a) : model(m), allocator(a) {}

  kiln_model_t* model;
  kiln::rt::Allocator allocator;
  kiln::rt::ThreadPool* pool = nullptr;
  kiln::rt::KvCache kv;
  // Paged (model->kv_pool): position p is in block block_table[p >> shift] of the
  // pool; blocks [0, held) are mapped.
  kiln::rt::KvPool* kv_pool = nullptr;
  int32_t* block_table = nullptr;  // [ceil(context / block)]
  int64_t held = 0;
  int64_t offered = 0;  // leading full blocks offered to the pool for other sessions to find
  kiln_session_options_t options = {};  // as resolved (kiln_session_fork; pressure_policy null)
  kiln_pressure_policy_t policy = {};
  int64_t context = 0;
  int64_t limit = 0;                     // positions the pressure policy lets it hold (<= context)
  uint32_t pressure_epoch = UINT32_MAX;  // the model's pressure_epoch last applied
  // A sliding window (kiln_context_overflow_t) evicted positions [hole_at, hole_at +
  // evicted) of the conversation: rows [0, hole_at) hold its first positions, row
  // r >= hole_at position r + evicted; evicted_hash identifies the evicted ids.
  int64_t hole_at = 0;
  int64_t evicted = 0;
  uint64_t evicted_hash[2] = {0, 0};
  int32_t* kv_rows = nullptr;  // [max_prefill]: the rows a stage writes (KvCache::row_scratch)
  int64_t max_prefill = 0;

  uint8_t* arena = nullptr;
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  kiln::rt::Vec<int64_t> value_rows;        // rows of every value during a stage run
  kiln::rt::Vec<kiln::rt::ActView> views;    // op operand views (scratch)

  // Session buffers for stage inputs and outputs.
  int32_t* ids = nullptr;        // [max_prefill]
  int32_t* positions = nullptr;  // [max_prefill]
  float* hidden = nullptr;       // [max_prefill, hidden]
  float* logits = nullptr;       // [1, vocab]
  float* pixels = nullptr;       // [3, S, S]
  float* vision_features = nullptr;
  float* image_features = nullptr;  // [image_tokens, hidden] (the artifact's count)
  int64_t image_tokens = 0;         // image tokens per image in this session (options.image_tokens)
  // Visual tokens at their original positions (image_positions_original): the row of
  // each kept token among the projector's tokens, ascending, and the positions the
  // whole image spans; position_shift: the next decoded token's position minus its
  // row + evicted.
  int32_t* image_rows = nullptr;  // [image_tokens]
  int64_t image_span = 0;
  int64_t position_shift = 0;

  bool has_image = false;     // pixels hold an image
  bool image_encoded = false; // image_features are up to date
  uint64_t image_hash[2] = {0, 0};  // of the pixels image_features were encoded from
  double pending_preprocess_ms = 0;
  int64_t position = 0;       // tokens in the KV cache

  // The ids whose keys and values the cache holds, at positions [0, cached): what the
  // next call may reuse instead of prefilling again (the common prefix of its ids).
  // Image tokens among them stand for the features of the current image; a new image
  // cuts the list before its first image token.
  int32_t* cached_ids = nullptr;  // [context]
  int64_t cached = 0;

  kiln::rt::Vec<int32_t> prompt;
  kiln::rt::Vec<int32_t> output;
  kiln::rt::WeightInputObserver observer = nullptr;  // calibration seam (kiln/kiln_calibration.h)
  void* observer_user = nullptr;
  kiln::rt::Vec<char> text;      // bytes of generated tokens not yet emitted
  int strip_pending = 0;         // leading spaces still to drop from the answer (Tokenizer::decode_strip)
  kiln::rt::Vec<char> text_out;  // the UTF-8 handed to the token callback
  kiln_stats_t stats = {};
  // kiln_session_set_op_profiling: calls and wall time of each op, per stage kind and
  // op index (sized when enabled).
  bool profile_ops = false;
  kiln::rt::Vec<kiln::rt::OpTime> op_time[kiln::rt::kNumStages];
};

namespace kiln::rt {

// Restores the bytes and encoding the kernels read for `tensor` to the artifact's.
void RestoreWeight(kiln_model_t* model, uint32_t tensor);

// kiln_model_load with the budget `budget` in place of the options' (and, unless
// `pool_from_budget`, no KV pool sized from it): loads under a shared budget.
kiln_status_t LoadModelFile(const char* path, const kiln_model_options_t* options, uint64_t budget,
                            bool pool_from_budget, kiln_model_t** out_model, kiln_error_t* error);

// Gives back the pages of the vision encoder's and projector's weights of a model
// mapped from a file (read from it again for the next image).
void DiscardImageWeights(kiln_model_t* model);

// Plans and creates the model's KV block pool, if one is asked for (after the memory
// budget check, which it repeats for an explicit pool size).
kiln_status_t SetUpKvPool(kiln_model_t* model, kiln_error_t* error);

// Runs one stage with its inputs bound; outputs go to `output`.
kiln_status_t RunStage(kiln_session_t* s, const fb::Stage* stage, const Binding* inputs, int num_inputs,
                       Binding output, kiln_error_t* error);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_MODEL_H_
