// Hooks for the compiler's calibration, which runs models through this runtime on the
// build host: an observer called after every op, and direct access to the image
// features of a session. Not part of the public API (kiln.h); C++ only.
#ifndef KILN_RUNTIME_SRC_OBSERVER_H_
#define KILN_RUNTIME_SRC_OBSERVER_H_

#include <cstddef>

#include "formats/kiln_generated.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"

namespace kiln::rt {

// Called after each op with its input and output views (valid during the call).
using OpObserver = void (*)(void* user, const fb::Stage* stage, const fb::Op* op, const ActView* inputs,
                            int num_inputs, const ActView& output);

// Installs (or, with null, removes) the observer of a session.
void SetOpObserver(kiln_session_t* session, OpObserver observer, void* user);

// Encodes the session's image now (if set and not yet encoded) and copies its
// features [image_tokens, hidden] to `out`; false when there is no image.
kiln_status_t GetImageFeatures(kiln_session_t* session, float* out, size_t capacity, kiln_error_t* error);

// Uses `features` [image_tokens, hidden] as the session's encoded image (skipping the
// vision encoder and projector).
kiln_status_t SetImageFeatures(kiln_session_t* session, const float* features, size_t count, kiln_error_t* error);

// Replaces the bytes and encoding the kernels read for weight `tensor` (until
// RestoreWeight): calibration measures a candidate encoding with the runtime's own
// kernels, without rewriting the artifact. `data` must outlive the override.
kiln_status_t OverrideWeight(kiln_model_t* model, uint32_t tensor, const uint8_t* data,
                             const format::EncodingSpec& spec, bool int8_activations, kiln_error_t* error);
void RestoreWeight(kiln_model_t* model, uint32_t tensor);

// The model's tensor index of a weight name, or -1.
int64_t FindTensor(const kiln_model_t* model, const char* name);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_OBSERVER_H_
