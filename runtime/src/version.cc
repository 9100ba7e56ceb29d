// Version of the linked runtime library.
#include "kiln/kiln.h"

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)

extern "C" const char* kiln_version_string(void) {
  return KILN_STR(KILN_VERSION_MAJOR) "." KILN_STR(KILN_VERSION_MINOR) "." KILN_STR(
      KILN_VERSION_PATCH);
}

extern "C" uint32_t kiln_version_number(void) { return KILN_VERSION_NUMBER; }
