/*
 * kiln_calibration.h — the runtime's internal seam for the compiler's calibration.
 *
 * The compiler measures a model at compile time by running it through this runtime
 * on the build host (compiler/calibration). This header is what it may use beyond
 * the public API (kiln.h): watching the activations each weight multiplies, reading
 * and replacing a session's image path, and swapping a weight's bytes and encoding
 * to measure a candidate encoding with the real kernels. It is installed beside
 * kiln.h but is not for applications: no stability promise across versions.
 *
 * Plain C, the conventions of kiln.h.
 */
#ifndef KILN_KILN_CALIBRATION_H_
#define KILN_KILN_CALIBRATION_H_

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called before every matrix product with the float activations it multiplies by
 * weight `tensor` (the artifact's tensor index): `rows` rows of `k` values, row
 * stride `ld`. For a gated MLP that is x for gate and up and act(gate x) * up x for
 * down; for a mixture of experts each expert's routed rows; for a patch embedding
 * the image's patches as rows. The pointer is valid during the call only. */
typedef void (*kiln_weight_input_observer_t)(void* user, uint32_t tensor, const float* x, int64_t rows,
                                             int64_t ld, int64_t k);

/* Installs (or, with NULL, removes) the observer of a session. */
KILN_API kiln_status_t kiln_calib_set_weight_observer(kiln_session_t* session,
                                                      kiln_weight_input_observer_t observer, void* user);

/* The preprocessed pixel values of the session's image, [3, S, S] floats. */
KILN_API kiln_status_t kiln_calib_get_pixel_values(kiln_session_t* session, float* out, size_t capacity,
                                                   kiln_error_t* out_error);

/* Encodes the session's image now (if set and not yet encoded) and copies its
 * features [image_tokens, hidden] to `out`. */
KILN_API kiln_status_t kiln_calib_get_image_features(kiln_session_t* session, float* out, size_t capacity,
                                                     kiln_error_t* out_error);

/* Uses `features` [image_tokens, hidden] as the session's encoded image (the vision
 * encoder and projector are skipped). Without the projector's selection, the tokens of
 * an artifact that keeps visual tokens at their original positions take consecutive
 * positions. */
KILN_API kiln_status_t kiln_calib_set_image_features(kiln_session_t* session, const float* features,
                                                     size_t count, kiln_error_t* out_error);

/* A storage encoding (formats/encodings.def ids). */
typedef struct kiln_calib_encoding_t {
  uint8_t encoding;
  uint32_t group;           /* int4 */
  int32_t symmetric;        /* int4 */
  int32_t int8_activations; /* W8A8 / W4A8 */
} kiln_calib_encoding_t;

/* Makes the kernels read `data` in `encoding` for weight `tensor` until
 * kiln_calib_restore_weight. `data` must outlive the override. No session of the
 * model may run concurrently. */
KILN_API kiln_status_t kiln_calib_override_weight(kiln_model_t* model, uint32_t tensor, const uint8_t* data,
                                                  const kiln_calib_encoding_t* encoding, kiln_error_t* out_error);
KILN_API void kiln_calib_restore_weight(kiln_model_t* model, uint32_t tensor);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_CALIBRATION_H_ */
