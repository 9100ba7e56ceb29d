/* Compiled as C11 with -Werror -pedantic: the public header must stay plain C. */
#include "kiln/kiln.h"

int kiln_c_header_smoke(void) {
  kiln_status_t s = KILN_ERROR_IO;
  if (kiln_status_message(s)[0] == '\0') return 1;
  if (kiln_version_number() != (uint32_t)KILN_VERSION_NUMBER) return 2;
  return 0;
}
