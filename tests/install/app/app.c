/* A tiny app that uses the installed Kiln runtime: loads a .kiln artifact, answers one
 * prompt (text-only here) and prints the answer and its time to first token.
 * usage: app MODEL.kiln [PROMPT] */
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"

static int on_token(void* user, int32_t token, const char* text, size_t length) {
  (void)user;
  (void)token;
  fwrite(text, 1, length, stdout);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.kiln [PROMPT]\n", argv[0]);
    return 2;
  }
  printf("kiln %s\n", kiln_version_string());
  kiln_error_t err;
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  kiln_model_t* model = NULL;
  if (kiln_model_load(argv[1], &mo, &model, &err) != KILN_OK) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  kiln_model_info_t info = {sizeof info};
  if (kiln_model_get_info(model, &info) != KILN_OK) return 1;
  printf("model %s, %d layers\n", info.architecture, info.num_layers);
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  kiln_session_t* session = NULL;
  if (kiln_session_create(model, &so, &session, &err) != KILN_OK) {
    fprintf(stderr, "%s\n", err.message);
    kiln_model_release(model);
    return 1;
  }
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = 8;
  go.on_token = on_token;
  printf("answer: ");
  kiln_status_t st = kiln_session_generate(session, argc > 2 ? argv[2] : "Hello", &go, &err);
  printf("\n");
  if (st != KILN_OK) fprintf(stderr, "%s\n", err.message);
  kiln_stats_t stats = {sizeof stats};
  if (st == KILN_OK && kiln_session_get_stats(session, &stats) == KILN_OK)
    printf("generated %d tokens, time to first token %.2f ms\n", stats.generated_tokens, stats.ttft_ms);
  kiln_session_release(session);
  kiln_model_release(model);
  return st == KILN_OK ? 0 : 1;
}
