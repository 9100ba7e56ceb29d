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

#if defined(_WIN32)
#define KILN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
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
  KILN_ERROR_INTERNAL = 99,        /* a broken invariant inside the runtime */

  KILN_STATUS_ARTIFACT_FIRST = 100,
  KILN_STATUS_ARTIFACT_LAST = 199,
  KILN_STATUS_EXECUTION_FIRST = 200,
  KILN_STATUS_EXECUTION_LAST = 299,
  KILN_STATUS_INPUT_FIRST = 300,
  KILN_STATUS_INPUT_LAST = 399
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */
