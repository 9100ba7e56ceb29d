/* An app that links an artifact's generated kernels as a static library (what an
 * iOS app does: kiln-compile --emit=static-library), loads the artifact with them
 * and prints the greedy tokens for the prompt ids given on the command line.
 *
 *   static_kernels_app MODEL.kiln ID...         with the library linked in
 *   static_kernels_app MODEL.kiln --none ID...  without passing it (must fail)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "model.kernels.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  int first = 2, pass_library = 1;
  if (strcmp(argv[2], "--none") == 0) {
    pass_library = 0;
    first = 3;
  }
  kiln_model_options_t mo;
  memset(&mo, 0, sizeof mo);
  mo.struct_size = sizeof mo;
  mo.kernels = pass_library ? &kiln_kernels_model : NULL;
  kiln_error_t err;
  kiln_model_t* model = NULL;
  if (kiln_model_load(argv[1], &mo, &model, &err) != KILN_OK) {
    fprintf(stderr, "load: %s (%s)\n", err.message, kiln_status_message(err.status));
    return 1;
  }
  kiln_session_options_t so;
  memset(&so, 0, sizeof so);
  so.struct_size = sizeof so;
  so.num_threads = 1;
  kiln_session_t* s = NULL;
  if (kiln_session_create(model, &so, &s, &err) != KILN_OK) {
    fprintf(stderr, "session: %s\n", err.message);
    return 1;
  }
  int32_t ids[64];
  int n = 0;
  for (int i = first; i < argc && n < 64; ++i) ids[n++] = (int32_t)atoi(argv[i]);
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = 6;
  if (kiln_session_generate_ids(s, ids, (size_t)n, &go, &err) != KILN_OK) {
    fprintf(stderr, "generate: %s\n", err.message);
    return 1;
  }
  int32_t out[64];
  size_t count = 0;
  kiln_session_get_output_ids(s, out, 64, &count);
  for (size_t i = 0; i < count; ++i) printf("%s%d", i ? " " : "", out[i]);
  printf("\n");
  kiln_session_release(s);
  kiln_model_release(model);
  return 0;
}
