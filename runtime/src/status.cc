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
    case KILN_ERROR_INTERNAL: return "internal error";
    default: break;
  }
  if (kiln_status_is_artifact_error(status)) return "artifact error";
  if (kiln_status_is_execution_error(status)) return "execution error";
  if (kiln_status_is_input_error(status)) return "input error";
  return "unknown status";
}
