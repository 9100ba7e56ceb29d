// Filling kiln_error_t: a status and a message naming what is at fault.
#ifndef KILN_RUNTIME_SUPPORT_ERROR_H_
#define KILN_RUNTIME_SUPPORT_ERROR_H_

#include "kiln/kiln.h"

namespace kiln::rt {

// Sets *error (when non-null) to `status` and the printf-formatted message, and
// returns `status`, so that `return Fail(err, KILN_ERROR_IO, "...", ...)` reads well.
kiln_status_t Fail(kiln_error_t* error, kiln_status_t status, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

// Clears *error (status KILN_OK, empty message).
void ClearError(kiln_error_t* error);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SUPPORT_ERROR_H_
