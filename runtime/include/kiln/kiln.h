/*
 * kiln.h — the public C API of the Kiln runtime.
 *
 * This is the only header an application includes. It is plain C11, does not
 * include any generated or third-party header, and is stable across patch releases.
 *
 * Conventions used by every declaration below:
 *  - Functions that can fail return kiln_status_t (KILN_OK == 0).
 *  - Output parameters come last and are prefixed out_; they are written only on
 *    success unless the documentation says otherwise.
 *  - Thread safety is stated on each function. Functions documented as "pure" touch
 *    no state at all and may be called from any thread at any time.
 *  - The runtime keeps no global mutable state.
 */
#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include <stddef.h>
#include <stdint.h>

/* KILN_API marks the exported functions. Building the library (KILN_BUILDING_LIBRARY,
 * set by Kiln's own build) exports them; an application including this header gets
 * plain declarations (dllimport on Windows with KILN_SHARED, the DLL). Everything else
 * in the library is hidden. */
#if defined(KILN_BUILDING_LIBRARY)
#if defined(_WIN32)
#define KILN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif
#elif defined(_WIN32) && defined(KILN_SHARED)
#define KILN_API __declspec(dllimport)
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------ */

/* Version of the headers the application was compiled against. */
#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_NUMBER \
  ((KILN_VERSION_MAJOR << 16) | (KILN_VERSION_MINOR << 8) | KILN_VERSION_PATCH)

/* Version of the linked runtime as "MAJOR.MINOR.PATCH". The returned string is static
 * and owned by the runtime. Pure. */
KILN_API const char* kiln_version_string(void);

/* Version of the linked runtime encoded like KILN_VERSION_NUMBER, so an application
 * can check at run time that the library it loaded is the one it was built for. Pure. */
KILN_API uint32_t kiln_version_number(void);

/* ------------------------------------------------------------------------------
 * Status codes
 *
 * Codes fall in documented ranges so that callers can classify a failure without
 * knowing every code:
 *      0        success
 *      1 –  99  API usage and environment (bad argument, memory, I/O, unsupported)
 *    100 – 199  artifact: the file is not a valid model for this runtime
 *    200 – 299  execution: the model cannot run the request (context full, budget)
 *    300 – 399  inputs: the image, text or tokens given to a session are unusable
 * New codes are only ever appended within a range; a code's number never changes.
 * ------------------------------------------------------------------------------ */
typedef enum kiln_status_t {
  KILN_OK = 0,

  /* 1 – 99: API usage and environment */
  KILN_ERROR_INVALID_ARGUMENT = 1, /* a NULL handle, an out-of-range option, ... */
  KILN_ERROR_OUT_OF_MEMORY = 2,    /* the allocator returned NULL */
  KILN_ERROR_IO = 3,               /* open/stat/mmap/read failed */
  KILN_ERROR_UNSUPPORTED = 4,      /* valid request this build cannot serve */
  KILN_ERROR_BUFFER_TOO_SMALL = 5, /* a caller-supplied buffer is too small */
  KILN_ERROR_CANCELLED = 6,        /* a callback asked to stop */
  KILN_ERROR_RESOURCE_EXHAUSTED = 7, /* does not fit the memory budget the app set */
  KILN_ERROR_INTERNAL = 99,        /* a broken invariant inside the runtime */

  /* 100 – 199: artifact */
  KILN_ERROR_ARTIFACT_NOT_KILN = 100,     /* no "KILN" identifier: not a Kiln model */
  KILN_ERROR_ARTIFACT_VERSION = 101,      /* schema version this runtime cannot read */
  KILN_ERROR_ARTIFACT_TRUNCATED = 102,    /* the file ends before its declared contents */
  KILN_ERROR_ARTIFACT_MALFORMED = 103,    /* the FlatBuffer header fails verification */
  KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS = 104,/* an index, offset or size points outside */
  KILN_ERROR_ARTIFACT_ALIGNMENT = 105,    /* a segment or tensor is misaligned */
  KILN_ERROR_ARTIFACT_SHAPE = 106,        /* a shape, dtype or size is inconsistent */
  KILN_ERROR_ARTIFACT_OP = 107,           /* an op has the wrong arity or parameters */
  KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL = 108, /* a kernel id this runtime does not have */
  KILN_ERROR_ARTIFACT_CPU_FEATURES = 109, /* the CPU lacks features the kernels need */
  KILN_ERROR_ARTIFACT_TOKENIZER = 110,    /* the tokenizer data is inconsistent */
  KILN_ERROR_ARTIFACT_CODE = 111,         /* the code segment cannot be loaded (bad ELF, relocation, symbol) */

  /* 200 – 299: execution */
  KILN_ERROR_CONTEXT_FULL = 200,   /* the request does not fit the session's context */
  KILN_ERROR_NONFINITE = 201,      /* the model computed NaN for every logit */

  /* 300 – 399: inputs */
  KILN_ERROR_INPUT_IMAGE = 300,    /* image of a size or format that cannot be used */
  KILN_ERROR_INPUT_TOKENS = 301,   /* token ids out of range, image-token count wrong */
  KILN_ERROR_INPUT_NOT_MULTIMODAL = 302, /* an image given to a text-only model */

  KILN_STATUS_ARTIFACT_FIRST = 100,
  KILN_STATUS_ARTIFACT_LAST = 199,
  KILN_STATUS_EXECUTION_FIRST = 200,
  KILN_STATUS_EXECUTION_LAST = 299,
  KILN_STATUS_INPUT_FIRST = 300,
  KILN_STATUS_INPUT_LAST = 399,

  /* Not a status: makes every non-negative 32-bit value a valid kiln_status_t, so
   * that codes added by later versions can be passed around safely. */
  KILN_STATUS_MAX_ENUM = 0x7FFFFFFF
} kiln_status_t;

/* A short, static, human-readable description of a status code ("ok",
 * "invalid argument", ...). A code this runtime does not know is described by its
 * range ("artifact error", "execution error", "input error") or as
 * "unknown status". Never returns NULL; the string is static. Pure. */
KILN_API const char* kiln_status_message(kiln_status_t status);

/* Range classification helpers. Pure. */
static inline int kiln_status_is_artifact_error(kiln_status_t s) {
  return s >= KILN_STATUS_ARTIFACT_FIRST && s <= KILN_STATUS_ARTIFACT_LAST;
}
static inline int kiln_status_is_execution_error(kiln_status_t s) {
  return s >= KILN_STATUS_EXECUTION_FIRST && s <= KILN_STATUS_EXECUTION_LAST;
}
static inline int kiln_status_is_input_error(kiln_status_t s) {
  return s >= KILN_STATUS_INPUT_FIRST && s <= KILN_STATUS_INPUT_LAST;
}

/* ------------------------------------------------------------------------------
 * Memory and errors
 * ------------------------------------------------------------------------------ */

/* Every allocation the runtime makes goes through an allocator: the default one
 * (malloc/free) or one the caller supplies at load and session creation. `alloc`
 * returns memory aligned to `alignment` (a power of two, at most 4096) or NULL;
 * `free` accepts NULL. Both must be callable from any thread. */
typedef struct kiln_allocator_t {
  void* (*alloc)(void* user, size_t size, size_t alignment);
  void (*free)(void* user, void* ptr);
  void* user;
} kiln_allocator_t;

/* Detail of a failure: functions that take a `kiln_error_t*` (which may be NULL)
 * fill it when they return anything but KILN_OK. The message names the file,
 * tensor, op or argument at fault. Caller-owned. */
typedef struct kiln_error_t {
  kiln_status_t status;
  char message[512];
} kiln_error_t;

/* ------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------ */

typedef struct kiln_model_t kiln_model_t;

/* Kernels generated for an artifact and linked into the application as a static
 * library (kiln-compile --emit=static-library), for platforms that do not let an
 * app load code (iOS). The library defines one of these (its header names it);
 * pass it in kiln_model_options_t.kernels. The runtime checks that `hash` is the
 * one the artifact names, so that an app never runs an artifact with another
 * build's kernels. */
typedef struct kiln_kernel_library_t {
  uint32_t struct_size;              /* sizeof(kiln_kernel_library_t) */
  uint32_t count;                    /* functions */
  uint64_t hash;                     /* the artifact's code checksum */
  const char* const* names;          /* [count] */
  void (*const* functions)(void);    /* [count], called with their family's signature */
} kiln_kernel_library_t;

typedef struct kiln_model_options_t {
  uint32_t struct_size;              /* sizeof(kiln_model_options_t) */
  const kiln_allocator_t* allocator; /* NULL: malloc/free; must outlive the model */
  /* The artifact's kernels when they are linked into the app instead of carried
   * in the file (NULL otherwise); must outlive the model. */
  const kiln_kernel_library_t* kernels;
  /* A memory budget in bytes (0: none). kiln_model_load computes what the model
   * needs with one session of `session` options (kiln_model_memory_report: mapped
   * weights, loaded code, the model's tables, the session's KV cache, arena and
   * buffers) and refuses it with KILN_ERROR_RESOURCE_EXHAUSTED, naming each part,
   * when that exceeds the budget; no weight is read before. */
  uint64_t memory_budget;
  const struct kiln_session_options_t* session; /* the session the budget is for (NULL: defaults) */
  /* A paged KV cache: one pool of KV blocks shared by the model's sessions of the
   * pool's encoding (`session`'s, else the artifact's). A session takes blocks of
   * kv_block_tokens positions as its conversation grows and returns them when it
   * shrinks or ends, so that several sessions fit where each holding its whole
   * context would not. A session whose prompt starts with the same tokens (the same
   * image and system prompt) as one whose blocks are in the pool maps those blocks
   * instead of prefilling them (whole blocks; they stay findable after their session
   * ended, until the pool needs them); kiln_session_fork shares blocks too; a block
   * another session holds, or a full one others may find, is copied before it is
   * written. When no block is
   * left, generation fails with KILN_ERROR_RESOURCE_EXHAUSTED. kv_pool_tokens:
   * the pool's positions (all sessions together; 0: with a memory budget, what the
   * budget leaves after the weights, code, tables and one session's other buffers,
   * in whole blocks: about that session's context or more, since the budget held it;
   * without one, no pool: each session allocates its whole context). */
  int64_t kv_pool_tokens;
  int32_t kv_block_tokens; /* positions per block: a power of two in [8, 1024]; 0: 32 */
  /* A tiered artifact (kiln-compile --tiers): the precision tier to load, 0 the
   * largest; -1 (kiln_model_options_init's): the largest whose weights, code, tables
   * and session fit memory_budget (the first without a budget), the smaller ones tried
   * in turn. kiln_model_info_t says which was loaded. An artifact without tiers has
   * tier 0 only. */
  int32_t tier;
  /* Profiling: a file (e.g. "/tmp/perf-<pid>.map", what Linux perf reads) to which
   * the load appends one line "ADDRESS SIZE NAME" (hex, hex, text) per exported
   * function of the code segment it maps, so that `perf report` names the generated
   * kernels (a function's size runs to the next one's start). NULL: none. Unused for
   * a kernel library linked into the app, whose symbols perf finds itself. A file
   * that cannot be written is reported as KILN_ERROR_IO. */
  const char* perf_map;
} kiln_model_options_t;

/* Defaults: struct_size set, no allocator (malloc/free), kernels from the artifact,
 * no memory budget, the largest tier that fits. */
KILN_API void kiln_model_options_init(kiln_model_options_t* options);

/* Maps the artifact at `path` read-only and verifies it completely (structure and
 * meaning: every index, offset, size, shape, op and kernel id, and the CPU features
 * its kernels need) before returning. Weights are used in place (zero-copy).
 * `options` may be NULL. On success *out_model owns the mapping.
 * Thread-safe: yes (no shared state). */
KILN_API kiln_status_t kiln_model_load(const char* path, const kiln_model_options_t* options,
                                       kiln_model_t** out_model, kiln_error_t* out_error);

/* As kiln_model_load, on an artifact already in memory (`data` must stay valid and
 * unchanged until the model is released; 64-byte alignment is required). */
KILN_API kiln_status_t kiln_model_load_from_memory(const void* data, size_t size,
                                                   const kiln_model_options_t* options,
                                                   kiln_model_t** out_model,
                                                   kiln_error_t* out_error);

/* Verifies the artifact at `path` completely, as kiln_model_load does, without
 * loading it. With `for_this_cpu` 0 the artifact is checked as for a CPU with every
 * feature it may require (an artifact built for a phone, checked on a build host):
 * its CPU features, its kernels' ISA and its code segment's machine are not held
 * against this CPU; everything else is. Thread-safe: yes. */
KILN_API kiln_status_t kiln_artifact_verify(const char* path, int for_this_cpu, kiln_error_t* out_error);

/* Releases a model. Every session created from it must be released first. NULL is
 * a no-op. */
KILN_API void kiln_model_release(kiln_model_t* model);

/* Output structs carry their size too, so that they can grow: the caller sets
 * struct_size (`kiln_model_info_t info = {sizeof info};`), the runtime writes the
 * fields that fit and sets struct_size to the bytes it wrote. */
typedef struct kiln_model_info_t {
  uint32_t struct_size;        /* sizeof(kiln_model_info_t), set by the caller */
  const char* architecture;    /* "LlavaForConditionalGeneration", ... */
  const char* prompt_template; /* the built-in template a runtime without chat templates
                                  applies: "llava", "llava-chatml", "idefics3", "plain" */
  const char* target;          /* target triple the artifact was compiled for */
  const char* source_hash;     /* hash of the source checkpoint (hex) */
  int32_t vocab_size;
  int32_t hidden_size;
  int32_t num_layers;
  int32_t max_position_embeddings;
  int32_t max_prefill_tokens; /* tokens one prefill step processes (longer prompts are chunked) */
  int32_t image_size;         /* 0 for text-only models */
  int32_t image_tokens;       /* tokens one image becomes (0: text-only) */
  int32_t image_token_id;     /* -1: text-only */
  uint64_t weight_bytes;      /* bytes of weights in the file */
  uint64_t file_bytes;
  int32_t tier;               /* the precision tier loaded (0: the largest) */
  int32_t tier_count;         /* tiers in the artifact (1: not tiered) */
  uint64_t tier_weight_budget;/* the weight budget the tier was compiled for (0: none) */
  int32_t image_tokens_scored;/* compiled with visual-token pruning: the encoder's tokens
                                 image_tokens are selected from (a session may keep fewer,
                                 kiln_session_options_t.image_tokens); 0: not pruned */
  const char* chat_template;  /* where the chat template the prompts are written with came
                                 from: "tokenizer_config.json", "chat_template.json",
                                 "built-in llava", a file; NULL: none, a prompt is
                                 tokenized as it is (prompt_template "plain") */
  int32_t image_positions_original; /* visual-token pruning with original positions (the
                                 default): each kept image token has the RoPE position it
                                 has unpruned and the text after the image too; 0: not
                                 pruned, or consecutive positions */
} kiln_model_info_t;

/* Facts about a loaded model. The strings are owned by the model. Thread-safe.
 * KILN_ERROR_INVALID_ARGUMENT when out_info->struct_size is not set. */
KILN_API kiln_status_t kiln_model_get_info(const kiln_model_t* model,
                                           kiln_model_info_t* out_info);

/* Tokenizes UTF-8 `text` with the model's tokenizer (special tokens written in the
 * text are recognised). With add_special, BOS is prepended when the tokenizer does.
 * Writes up to `capacity` ids; *out_count receives the full count, and
 * KILN_ERROR_BUFFER_TOO_SMALL is returned when it exceeds `capacity`.
 * Thread-safe. */
KILN_API kiln_status_t kiln_tokenize(const kiln_model_t* model, const char* text, size_t length,
                                     int add_special, int32_t* out_ids, size_t capacity,
                                     size_t* out_count, kiln_error_t* out_error);

/* Decodes ids to UTF-8 (invalid sequences become U+FFFD). Writes up to `capacity`
 * bytes plus a terminating NUL when there is room; *out_length receives the full
 * length without NUL. Thread-safe. */
KILN_API kiln_status_t kiln_detokenize(const kiln_model_t* model, const int32_t* ids,
                                       size_t count, int skip_special, char* out_text,
                                       size_t capacity, size_t* out_length,
                                       kiln_error_t* out_error);

/* ------------------------------------------------------------------------------
 * Several models under one memory budget
 *
 * An app that runs a VLM and, say, a small text model opens both under one budget:
 * each is loaded when it is acquired, and when it does not fit beside the others,
 * the least recently used models nobody holds are unloaded first. What a model
 * counts against the budget is kiln_model_memory_report's total for one session of
 * its options' `session` (a paged KV cache only of kv_pool_tokens: the budget does
 * not size pools here).
 * ------------------------------------------------------------------------------ */

typedef struct kiln_shared_budget_t kiln_shared_budget_t;

/* A budget of `bytes` (> 0). Thread-safe: its functions may be called from any thread. */
KILN_API kiln_status_t kiln_shared_budget_create(uint64_t bytes, kiln_shared_budget_t** out_budget,
                                                 kiln_error_t* out_error);

/* Unloads every model. None may be held (acquired and not returned). NULL is a no-op. */
KILN_API void kiln_shared_budget_release(kiln_shared_budget_t* budget);

/* Adds the artifact at `path`, loaded with `options` (NULL: defaults; their
 * memory_budget is ignored, the pointers they hold must outlive the budget). It is
 * loaded once now to verify it and measure what it needs, then unloaded: a model that
 * cannot fit the whole budget on its own is refused here (KILN_ERROR_RESOURCE_EXHAUSTED
 * naming each part). *out_id identifies it. */
KILN_API kiln_status_t kiln_shared_budget_add(kiln_shared_budget_t* budget, const char* path,
                                              const kiln_model_options_t* options, int32_t* out_id,
                                              kiln_error_t* out_error);

/* The model `id`, loaded if it is not, and held until kiln_shared_budget_return: a
 * held model is never unloaded. When it does not fit beside the loaded ones, models
 * nobody holds are unloaded, least recently used first; when those held leave no
 * room, KILN_ERROR_RESOURCE_EXHAUSTED names them. A model may be held several times
 * (each acquire returned once). */
KILN_API kiln_status_t kiln_shared_budget_acquire(kiln_shared_budget_t* budget, int32_t id,
                                                  kiln_model_t** out_model, kiln_error_t* out_error);

/* Gives back one hold of model `id`; it stays loaded until another needs its room.
 * Its sessions must be released before its last hold is given back. */
KILN_API kiln_status_t kiln_shared_budget_return(kiln_shared_budget_t* budget, int32_t id);

typedef struct kiln_shared_budget_info_t {
  uint32_t struct_size;  /* sizeof(kiln_shared_budget_info_t), set by the caller */
  uint64_t budget_bytes;
  uint64_t used_bytes;   /* what the loaded models count */
  int32_t models;        /* added */
  int32_t loaded;        /* loaded now */
  int32_t loads;         /* loads by acquire since the budget was created */
  int32_t unloads;       /* models unloaded to make room */
  /* With id >= 0 in kiln_shared_budget_get_info: that model's */
  int32_t model_loaded;
  int32_t model_holds;
  uint64_t model_bytes;  /* what it counts (loaded or not) */
} kiln_shared_budget_info_t;

/* The budget's figures, and model `id`'s (-1: none). Thread-safe. */
KILN_API kiln_status_t kiln_shared_budget_get_info(kiln_shared_budget_t* budget, int32_t id,
                                                   kiln_shared_budget_info_t* out_info);

/* ------------------------------------------------------------------------------
 * Sessions: one conversation with a model
 * ------------------------------------------------------------------------------ */

typedef struct kiln_session_t kiln_session_t;

/* Encodings of a session's KV cache (docs/performance.md, "KV cache"): f16 halves
 * f32's bytes; int8 and int4 store symmetric codes with one f32 scale per group of 32
 * channels of a position's keys or values (per head when head_dim is not a multiple
 * of 32), about 3.6x and 6.4x smaller than f32. */
typedef enum kiln_kv_cache_t {
  KILN_KV_CACHE_DEFAULT = 0, /* the artifact's (kiln-compile --kv-cache) */
  KILN_KV_CACHE_F32 = 1,
  KILN_KV_CACHE_F16 = 2,
  KILN_KV_CACHE_INT8 = 3,
  KILN_KV_CACHE_INT4 = 4
} kiln_kv_cache_t;

/* What a session does when its conversation outgrows its context (the session's
 * context_length, a shorter one a pressure policy sets, or a full KV block pool). */
typedef enum kiln_context_overflow_t {
  /* Generation fails: KILN_ERROR_CONTEXT_FULL (KILN_ERROR_RESOURCE_EXHAUSTED for a full
   * pool). A pressure policy's shorter context still slides. */
  KILN_CONTEXT_STOP = 0,
  /* A sliding window: the oldest positions after the first keep_tokens (the image and
   * the system prompt) are evicted, a few at a time (whole blocks of a paged cache), and
   * generation goes on. The kept positions keep their places: later tokens' positions
   * (RoPE) go on counting, and the window attends to what it holds. */
  KILN_CONTEXT_SLIDE = 1
} kiln_context_overflow_t;

struct kiln_pressure_policy_t;

typedef struct kiln_session_options_t {
  uint32_t struct_size;              /* sizeof(kiln_session_options_t) */
  int32_t num_threads;               /* 0: the performance cores this process may run on
                                        (a big.LITTLE CPU's slowest cluster left out) */
  int32_t context_length;            /* KV-cache capacity in tokens; 0: the model's
                                        maximum, capped at 4096 */
  const kiln_allocator_t* allocator; /* NULL: the model's allocator */
  int32_t kv_cache;                  /* kiln_kv_cache_t; any encoding may replace the
                                        artifact's */
  int32_t context_overflow;          /* kiln_context_overflow_t */
  int32_t keep_tokens;               /* positions at the start a sliding window keeps;
                                        0: through the last image token the cache holds,
                                        at least 4 (rounded up to whole KV blocks) */
  /* How the session reacts to kiln_model_set_pressure (copied at creation; NULL:
   * kiln_pressure_policy_init's). */
  const struct kiln_pressure_policy_t* pressure_policy;
  /* Image tokens one image becomes in this session: 0, the artifact's
   * (kiln_model_info_t.image_tokens); fewer keeps only the best-scoring ones, a
   * faster prefill for some accuracy (artifacts compiled with visual-token pruning,
   * kiln-compile --visual-tokens; others: KILN_ERROR_INVALID_ARGUMENT). */
  int32_t image_tokens;
} kiln_session_options_t;

/* Defaults: struct_size set, the performance cores, the model's context (at most
 * 4096), the model's allocator, the artifact's KV-cache encoding, KILN_CONTEXT_STOP,
 * the default pressure policy. */
KILN_API void kiln_session_options_init(kiln_session_options_t* options);

/* ------------------------------------------------------------------------------
 * Pressure: the device is short of memory, hot, or on a low battery
 * ------------------------------------------------------------------------------ */

typedef enum kiln_pressure_kind_t {
  KILN_PRESSURE_MEMORY = 0,  /* Android onTrimMemory / iOS didReceiveMemoryWarning */
  KILN_PRESSURE_THERMAL = 1, /* PowerManager thermal status / ProcessInfo.thermalState */
  KILN_PRESSURE_BATTERY = 2  /* battery saver / Low Power Mode */
} kiln_pressure_kind_t;

typedef enum kiln_pressure_level_t {
  KILN_PRESSURE_NONE = 0,
  KILN_PRESSURE_MODERATE = 1,
  KILN_PRESSURE_SERIOUS = 2,
  KILN_PRESSURE_CRITICAL = 3
} kiln_pressure_level_t;

/* A session's reaction to each pressure level (index: kiln_pressure_level_t). A
 * session applies its model's levels when a generate call starts and before every
 * decode step. */
typedef struct kiln_pressure_policy_t {
  uint32_t struct_size; /* sizeof(kiln_pressure_policy_t) */
  /* By the higher of the thermal and battery levels: the threads the session runs at
   * most (0: all of its num_threads). The others sleep. */
  int32_t max_threads[4];
  /* By the memory level: the positions the session keeps at most (0: its context).
   * Past it, the oldest positions after keep_tokens are evicted whatever
   * context_overflow says; a paged cache's freed blocks go back to the pool. Never
   * less than keep_tokens plus 64 positions (two KV blocks when larger). */
  int32_t max_context[4];
} kiln_pressure_policy_t;

/* Defaults: max_threads {0, 0, 2, 1} (serious: two threads, critical: one);
 * max_context {0, 0, 1024, 512}. */
KILN_API void kiln_pressure_policy_init(kiln_pressure_policy_t* policy);

/* Tells the runtime the device's `kind` of pressure is now at `level`. Thread-safe:
 * call it from the system's callback while sessions generate. The model's sessions
 * react at their next generate call or decode step, by their policies. At the memory
 * level KILN_PRESSURE_SERIOUS or above the model also gives back what it can at once:
 * the pages of a paged KV pool's free blocks (their cached prefixes are forgotten),
 * and, for a model loaded from a file, the vision encoder's and projector's weight
 * pages (read again from the file for the next image; dropped again after each image
 * while the level lasts). KILN_PRESSURE_NONE ends the pressure of that kind. */
KILN_API kiln_status_t kiln_model_set_pressure(kiln_model_t* model, int32_t kind, int32_t level);

/* What a model needs in memory with one session of the given options (NULL:
 * defaults): the arithmetic kiln_model_options_t.memory_budget is checked against.
 * Weights are counted whole (a model reads every weight it runs; a text-only
 * request leaves the vision encoder's pages unread), the KV cache at its full
 * context (its pages become resident as the context fills). The process's own code,
 * libraries and thread stacks are not included. Thread-safe. */
typedef struct kiln_memory_report_t {
  uint32_t struct_size;      /* sizeof(kiln_memory_report_t), set by the caller */
  uint64_t weight_bytes;     /* mapped weights (file-backed) */
  uint64_t code_bytes;       /* generated kernels in executable memory */
  uint64_t model_bytes;      /* the model's allocations: tokenizer, kernel tables */
  uint64_t session_bytes;    /* one session (kiln_model_session_bytes), of which: */
  uint64_t kv_cache_bytes;   /*   its KV cache */
  uint64_t arena_bytes;      /*   its activation arena */
  uint64_t total_bytes;      /* weights + code + model + session */
  int32_t context_length;    /* the session's context, resolved */
  int32_t kv_cache;          /* kiln_kv_cache_t of the session, resolved */
  uint64_t kv_pool_bytes;    /* a paged cache's pool (kiln_model_options_t.kv_pool_tokens),
                                shared by the sessions: then kv_cache_bytes is the pool's
                                and session_bytes counts the session's block table */
  int32_t kv_block_tokens;   /* positions per block of the pool (0: unpaged) */
  int32_t kv_pool_blocks;    /* the pool's blocks */
} kiln_memory_report_t;

KILN_API kiln_status_t kiln_model_memory_report(const kiln_model_t* model,
                                                const kiln_session_options_t* options,
                                                kiln_memory_report_t* out_report,
                                                kiln_error_t* out_error);

/* Creates a session: the activation arena, the KV cache and the thread pool are
 * allocated here, once; generation allocates nothing. `options` may be NULL.
 * A session is used by one thread at a time; distinct sessions may run
 * concurrently on the same model. */
KILN_API kiln_status_t kiln_session_create(kiln_model_t* model,
                                           const kiln_session_options_t* options,
                                           kiln_session_t** out_session,
                                           kiln_error_t* out_error);

/* NULL is a no-op. */
KILN_API void kiln_session_release(kiln_session_t* session);

/* A new session with `session`'s options, image and conversation: its KV cache holds
 * the same positions, so that a question asked of either reuses the shared prefix
 * (kiln_stats_t.reused_tokens). With a paged cache (kiln_model_options_t.
 * kv_pool_tokens) the two share the blocks, and the first to write into a shared one
 * copies it; otherwise the positions are copied. For several questions about one
 * photo asked in parallel: prefill the image and system prompt once, then fork. */
KILN_API kiln_status_t kiln_session_fork(kiln_session_t* session, kiln_session_t** out_session,
                                         kiln_error_t* out_error);

/* The bytes kiln_session_create would allocate for `options` (NULL: defaults): the
 * KV cache, the activation arena, the kernels' scratch for the thread count, the
 * stage buffers and the session itself. Computed without allocating, so that an app
 * can decide against its memory budget before creating a session. The mapped
 * weights are not included (kiln_model_info_t.weight_bytes). Thread-safe. */
KILN_API kiln_status_t kiln_model_session_bytes(const kiln_model_t* model,
                                                const kiln_session_options_t* options,
                                                uint64_t* out_bytes, kiln_error_t* out_error);

/* Sets the image the next prompt asks about, as 8-bit RGB pixels (row stride in
 * bytes, >= 3 * width). It is preprocessed as the checkpoint's image processor does
 * (resize, crop, rescale, normalise) and encoded by the vision encoder and projector
 * during the next generate call. The pixels are copied; the caller may free them. */
KILN_API kiln_status_t kiln_session_set_image_rgb(kiln_session_t* session, const uint8_t* rgb,
                                                  int32_t width, int32_t height, size_t stride,
                                                  kiln_error_t* out_error);

/* Sets already preprocessed pixel values [channels, image_size, image_size] (f32),
 * bypassing preprocessing: for exact comparisons with a reference. */
KILN_API kiln_status_t kiln_session_set_pixel_values(kiln_session_t* session,
                                                     const float* pixel_values, size_t count,
                                                     kiln_error_t* out_error);

/* Forgets the image and the conversation (the KV cache). */
KILN_API kiln_status_t kiln_session_reset(kiln_session_t* session);

/* Called for every generated token with its id and the UTF-8 text it completes (may
 * be empty while a multi-byte character is incomplete). Return non-zero to stop:
 * generation then ends with KILN_ERROR_CANCELLED. */
typedef int (*kiln_token_callback_t)(void* user, int32_t token, const char* text,
                                     size_t length);

typedef struct kiln_generate_options_t {
  uint32_t struct_size;     /* sizeof(kiln_generate_options_t) */
  int32_t max_new_tokens;   /* 0: the checkpoint's generation config, else 128 */
  float temperature;        /* 0: greedy; finite and >= 0, else KILN_ERROR_INVALID_ARGUMENT */
  int32_t top_k;            /* 0: no top-k filter; >= 0 */
  float top_p;              /* 1 (or 0, as zero-initialised): no nucleus filter; in [0, 1] */
  uint64_t seed;            /* sampling seed */
  kiln_token_callback_t on_token; /* may be NULL */
  void* user;
  int32_t reuse_prefix;     /* 1 (the default): the longest common prefix of this prompt's
                               ids and those the session's KV cache holds (the previous
                               prompt and answer, while the image is the same) is not
                               prefilled again; 0: every id is */
  float repetition_penalty; /* transformers' (0 or 1: off; else > 0 and finite): before
                               each token is chosen, the logit of every id already in the
                               sequence (prompt and answer) is divided by it when positive
                               and multiplied by it when negative */
} kiln_generate_options_t;

/* Defaults: greedy, max_new_tokens from the checkpoint (else 128), prefix reuse, no
 * repetition penalty. */
KILN_API void kiln_generate_options_init(kiln_generate_options_t* options);

/* The checkpoint's generation_config.json as defaults (kiln-inspect prints it):
 * with do_sample its temperature, top_k and top_p, else greedy; its
 * repetition_penalty; max_new_tokens 0 (the config's, else 128); prefix reuse.
 * `model` NULL: kiln_generate_options_init's. */
KILN_API void kiln_generate_options_init_from_model(const kiln_model_t* model, kiln_generate_options_t* options);

/* One message of a conversation. */
typedef struct kiln_chat_message_t {
  const char* role;    /* "system", "user" or "assistant" */
  const char* content; /* UTF-8 */
  int32_t image;       /* non-zero: the session's image comes before this message's content
                          (a user message; one message at most) */
} kiln_chat_message_t;

/* The text of `messages` in the model's chat template (the checkpoint's Jinja
 * template, compiled into fixed text around each message), followed by the
 * generation prompt: what transformers' apply_chat_template(messages,
 * add_generation_prompt=True, tokenize=False) returns, an image written as one image
 * token. The last message must be a user message; a template that refuses a
 * conversation (e.g. roles that do not alternate) is KILN_ERROR_INVALID_ARGUMENT.
 * A model without a chat template (kiln_model_info_t.chat_template NULL) takes one
 * user message, written as it is. Writes up to `capacity` bytes plus a NUL when there
 * is room; *out_length receives the full length (KILN_ERROR_BUFFER_TOO_SMALL when it
 * does not fit). Thread-safe. */
KILN_API kiln_status_t kiln_model_apply_chat_template(const kiln_model_t* model,
                                                      const kiln_chat_message_t* messages,
                                                      size_t count, char* out, size_t capacity,
                                                      size_t* out_length, kiln_error_t* out_error);

/* Answers `prompt` (UTF-8) about the image set before (if any): applies the model's
 * prompt template, tokenizes, encodes the image, prefills, then decodes until an
 * end-of-sequence token or max_new_tokens, streaming tokens to on_token. Each call
 * starts a new conversation; what it shares with the previous call's prompt and
 * answer from the start (the image, the system prompt) is not prefilled again
 * (reuse_prefix; kiln_stats_t.reused_tokens), and an image set again unchanged is
 * not encoded again. `options` may be NULL (defaults). */
KILN_API kiln_status_t kiln_session_generate(kiln_session_t* session, const char* prompt,
                                             const kiln_generate_options_t* options,
                                             kiln_error_t* out_error);

/* As kiln_session_generate for a conversation: the messages in the model's chat
 * template (kiln_model_apply_chat_template), the image expanded into image tokens,
 * tokenized, then prefill and decode. Pass the whole conversation each turn, the
 * model's previous answers as "assistant" messages: the prefix the KV cache already
 * holds is not prefilled again (reuse_prefix). kiln_session_generate(prompt) is this
 * with one user message (carrying the image, if one is set). */
KILN_API kiln_status_t kiln_session_chat(kiln_session_t* session, const kiln_chat_message_t* messages,
                                         size_t count, const kiln_generate_options_t* options,
                                         kiln_error_t* out_error);

/* The token ids kiln_session_generate would feed the model for `prompt`: the prompt
 * template applied, the image (if set) expanded into image tokens, tokenized.
 * Writes up to `capacity` ids; *out_count receives the full count
 * (KILN_ERROR_BUFFER_TOO_SMALL when it exceeds `capacity`). */
KILN_API kiln_status_t kiln_session_prompt_ids(kiln_session_t* session, const char* prompt,
                                               int32_t* out_ids, size_t capacity,
                                               size_t* out_count, kiln_error_t* out_error);

/* As kiln_session_generate on token ids the caller prepared (template and
 * tokenizer bypassed). Image tokens in `ids` receive the image's features; their
 * count must equal the model's image_tokens when an image is set. */
KILN_API kiln_status_t kiln_session_generate_ids(kiln_session_t* session, const int32_t* ids,
                                                 size_t count,
                                                 const kiln_generate_options_t* options,
                                                 kiln_error_t* out_error);

/* Runs the prompt `ids` (with the image, if set) through prefill and writes the
 * logits of every position, [count, vocab_size] f32 row-major, to out_logits
 * (capacity in floats). Resets the conversation first. For exact comparisons. */
KILN_API kiln_status_t kiln_session_prefill_logits(kiln_session_t* session, const int32_t* ids,
                                                   size_t count, float* out_logits,
                                                   size_t capacity, kiln_error_t* out_error);

/* Token ids generated by the last generate call. *out_count receives the total;
 * up to `capacity` are written. */
KILN_API kiln_status_t kiln_session_get_output_ids(const kiln_session_t* session,
                                                   int32_t* out_ids, size_t capacity,
                                                   size_t* out_count);

/* Time and memory of the last generate call, split by stage. Time-to-first-token
 * is the sum of the first five stages: the first token is chosen from the prefill's
 * logits. */
typedef struct kiln_stats_t {
  uint32_t struct_size;       /* sizeof(kiln_stats_t), set by the caller (see kiln_model_info_t) */
  double image_preprocess_ms; /* resize, crop, normalise */
  double vision_encoder_ms;
  double projector_ms;
  double prefill_ms;          /* LLM prefill incl. the LM head on the last position,
                                 the prompt's tokenizing and the KV cache's preparation */
  double first_token_ms;      /* sampling and detokenising the first token */
  double ttft_ms;             /* sum of the above */
  double first_decode_ms;     /* the decode step that produced the second token */
  double decode_ms;           /* all decode steps */
  double decode_tokens_per_s; /* decode_steps / decode_ms: forward passes of decode per
                                 second, the one that produced an end-of-sequence token
                                 included (as llama-bench counts evaluated tokens) */
  int32_t prompt_tokens;      /* incl. image tokens */
  int32_t image_tokens;
  int32_t generated_tokens;
  int32_t num_threads;
  uint64_t arena_bytes;       /* activation arena of the session */
  uint64_t kv_cache_bytes;    /* KV cache of the session */
  uint64_t peak_allocated_bytes; /* high-water mark of the session's allocations */
  uint64_t weight_bytes;      /* mapped weights (file-backed, shared, not allocated) */
  int32_t decode_steps;       /* decode forward passes: generated_tokens - 1, plus 1 when an
                                 end-of-sequence token ended the answer */
  int32_t kv_cache;           /* kiln_kv_cache_t of the session's cache (never DEFAULT) */
  uint64_t kv_cache_token_bytes; /* KV-cache bytes per token over every layer */
  int32_t reused_tokens;      /* prompt tokens whose keys and values the previous call left in
                                 the cache (kiln_generate_options_t.reuse_prefix): not
                                 prefilled, not in prefill_ms */
  int32_t kv_block_tokens;    /* a paged cache: positions per block (0: unpaged) */
  int32_t kv_blocks;          /*   blocks this session holds (shared ones included) */
  int32_t kv_pool_blocks;     /*   the pool's blocks */
  int32_t kv_pool_blocks_used;/*   taken by any session */
  int32_t context_limit;      /* positions the session may hold now (its context, or less
                                 under memory pressure) */
  int32_t evicted_tokens;     /* positions of the conversation a sliding window evicted
                                 (kiln_context_overflow_t): the cache holds the rest */
  int32_t active_threads;     /* threads the last decode step ran (fewer than num_threads
                                 under thermal or battery pressure) */
} kiln_stats_t;

/* KILN_ERROR_INVALID_ARGUMENT when out_stats->struct_size is not set. */
KILN_API kiln_status_t kiln_session_get_stats(const kiln_session_t* session,
                                              kiln_stats_t* out_stats);

/* Per-op timing, to see where a stage's time goes (kiln-run --profile). Off by
 * default. Enabling it (nonzero) clears the counters; from then on every op a stage
 * runs adds its wall time (a clock read before and after the op, on the calling
 * thread) to the op's entry; disabling stops counting. KILN_ERROR_OUT_OF_MEMORY when
 * the counters cannot be allocated. */
KILN_API kiln_status_t kiln_session_set_op_profiling(kiln_session_t* session, int enable,
                                                     kiln_error_t* out_error);

/* One op of the artifact and its time. The strings live as long as the model. This
 * struct does not grow: a later version adds another function instead. */
typedef struct kiln_op_profile_t {
  const char* stage;  /* "VisionEncoder", "Projector", "DecoderPrefill", "DecoderDecode",
                         "LmHead" */
  const char* name;   /* the op's name in the artifact (model.layers.0.mlp...) */
  const char* kind;   /* its kind: "Linear", "QkvAttention", "GatedMlp", ... */
  const char* kernel; /* its kernel ("..._gen": generated for this artifact) */
  uint64_t calls;     /* times it ran since profiling was enabled */
  double total_ms;    /* their wall time */
} kiln_op_profile_t;

/* Every op of the artifact, stage by stage in the order they run, ops never run
 * included (calls 0). *out_count receives the number of ops; up to `capacity` entries
 * are written (out may be NULL when capacity is 0). KILN_ERROR_INVALID_ARGUMENT when
 * profiling was never enabled. */
KILN_API kiln_status_t kiln_session_get_op_profile(const kiln_session_t* session,
                                                   kiln_op_profile_t* out, size_t capacity,
                                                   size_t* out_count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */
