#include "support/error.h"

#include <cstdarg>
#include <cstdio>

namespace kiln::rt {

kiln_status_t Fail(kiln_error_t* error, kiln_status_t status, const char* format, ...) {
  if (error != nullptr) {
    error->status = status;
    va_list args;
    va_start(args, format);
    std::vsnprintf(error->message, sizeof(error->message), format, args);
    va_end(args);
  }
  return status;
}

void ClearError(kiln_error_t* error) {
  if (error != nullptr) {
    error->status = KILN_OK;
    error->message[0] = '\0';
  }
}

}  // namespace kiln::rt
