// Status codes and their descriptions (see kiln.h for the ranges).
#include "kiln/kiln.h"

extern "C" const char* kiln_status_message(kiln_status_t status) {
  switch (status) {
    case KILN_OK: return "ok";
    case KILN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case KILN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case KILN_ERROR_IO: return "i/o error";
    case KILN_ERROR_UNSUPPORTED: return "unsupported";
    case KILN_ERROR_BUFFER_TOO_SMALL: return "buffer too small";
    case KILN_ERROR_CANCELLED: return "cancelled";
    case KILN_ERROR_RESOURCE_EXHAUSTED: return "does not fit the memory budget";
    case KILN_ERROR_INTERNAL: return "internal error";
    case KILN_ERROR_ARTIFACT_NOT_KILN: return "not a Kiln artifact";
    case KILN_ERROR_ARTIFACT_VERSION: return "unsupported artifact schema version";
    case KILN_ERROR_ARTIFACT_TRUNCATED: return "truncated artifact";
    case KILN_ERROR_ARTIFACT_MALFORMED: return "malformed artifact header";
    case KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS: return "artifact reference out of bounds";
    case KILN_ERROR_ARTIFACT_ALIGNMENT: return "misaligned artifact data";
    case KILN_ERROR_ARTIFACT_SHAPE: return "inconsistent tensor shape or size";
    case KILN_ERROR_ARTIFACT_OP: return "malformed op";
    case KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL: return "unknown kernel";
    case KILN_ERROR_ARTIFACT_CPU_FEATURES: return "CPU lacks required features";
    case KILN_ERROR_ARTIFACT_TOKENIZER: return "malformed tokenizer";
    case KILN_ERROR_ARTIFACT_CODE: return "unloadable code segment";
    case KILN_ERROR_CONTEXT_FULL: return "context full";
    case KILN_ERROR_NONFINITE: return "non-finite logits";
    case KILN_ERROR_INPUT_IMAGE: return "unusable image";
    case KILN_ERROR_INPUT_TOKENS: return "invalid token ids";
    case KILN_ERROR_INPUT_NOT_MULTIMODAL: return "model takes no images";
    default: break;
  }
  if (kiln_status_is_artifact_error(status)) return "artifact error";
  if (kiln_status_is_execution_error(status)) return "execution error";
  if (kiln_status_is_input_error(status)) return "input error";
  return "unknown status";
}
