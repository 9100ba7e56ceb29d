/* JNI binding of the Kiln C API for Java and Kotlin (Android apps): the native methods
 * of kiln.KilnJni (runtime/bindings/jni/java/kiln/KilnJni.java). Build it into the app's
 * shared library beside libkiln (docs/integration.md, "Android"). Strings cross as UTF-8
 * bytes turned into java.lang.String by its UTF-8 constructor (JNI's NewStringUTF reads
 * modified UTF-8, which mangles characters outside the BMP, such as emoji). */
#include <jni.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static void ThrowStatus(JNIEnv* env, kiln_status_t status, const char* what, const char* message) {
  jclass cls = (*env)->FindClass(env, "kiln/KilnJni$KilnException");
  if (cls == NULL) return; /* NoClassDefFoundError pending */
  jmethodID ctor = (*env)->GetMethodID(env, cls, "<init>", "(ILjava/lang/String;)V");
  char text[sizeof(((kiln_error_t*)0)->message) + 64];
  snprintf(text, sizeof text, "%s: %s", what, message != NULL && message[0] != '\0' ? message : kiln_status_message(status));
  jstring jtext = (*env)->NewStringUTF(env, text); /* ASCII and the runtime's messages */
  if (ctor == NULL || jtext == NULL) return;
  jobject ex = (*env)->NewObject(env, cls, ctor, (jint)status, jtext);
  if (ex != NULL) (*env)->Throw(env, (jthrowable)ex);
}

/* A Java String of `length` UTF-8 bytes. */
static jstring Utf8String(JNIEnv* env, const char* bytes, size_t length) {
  jbyteArray array = (*env)->NewByteArray(env, (jsize)length);
  if (array == NULL) return NULL;
  (*env)->SetByteArrayRegion(env, array, 0, (jsize)length, (const jbyte*)bytes);
  jclass string_class = (*env)->FindClass(env, "java/lang/String");
  jmethodID ctor = (*env)->GetMethodID(env, string_class, "<init>", "([BLjava/lang/String;)V");
  jstring charset = (*env)->NewStringUTF(env, "UTF-8");
  if (ctor == NULL || charset == NULL) return NULL;
  jstring s = (jstring)(*env)->NewObject(env, string_class, ctor, array, charset);
  (*env)->DeleteLocalRef(env, array);
  (*env)->DeleteLocalRef(env, charset);
  return s;
}

/* The UTF-8 bytes of a Java String, NUL-terminated, malloc'd (NULL with an exception
 * pending). String.getBytes("UTF-8") for the same reason as above. */
static char* Utf8Bytes(JNIEnv* env, jstring s) {
  jclass string_class = (*env)->FindClass(env, "java/lang/String");
  jmethodID get_bytes = (*env)->GetMethodID(env, string_class, "getBytes", "(Ljava/lang/String;)[B");
  jstring charset = (*env)->NewStringUTF(env, "UTF-8");
  if (get_bytes == NULL || charset == NULL) return NULL;
  jbyteArray array = (jbyteArray)(*env)->CallObjectMethod(env, s, get_bytes, charset);
  (*env)->DeleteLocalRef(env, charset);
  if (array == NULL) return NULL;
  jsize n = (*env)->GetArrayLength(env, array);
  char* out = (char*)malloc((size_t)n + 1);
  if (out == NULL) {
    ThrowStatus(env, KILN_ERROR_OUT_OF_MEMORY, "string", "out of memory");
    return NULL;
  }
  (*env)->GetByteArrayRegion(env, array, 0, n, (jbyte*)out);
  out[n] = '\0';
  (*env)->DeleteLocalRef(env, array);
  return out;
}

JNIEXPORT jstring JNICALL Java_kiln_KilnJni_version(JNIEnv* env, jclass cls) {
  (void)cls;
  const char* v = kiln_version_string();
  return Utf8String(env, v, strlen(v));
}

JNIEXPORT jlong JNICALL Java_kiln_KilnJni_loadModel(JNIEnv* env, jclass cls, jstring path) {
  (void)cls;
  char* p = Utf8Bytes(env, path);
  if (p == NULL) return 0;
  kiln_error_t err;
  kiln_model_t* model = NULL;
  kiln_status_t st = kiln_model_load(p, NULL, &model, &err);
  free(p);
  if (st != KILN_OK) {
    ThrowStatus(env, st, "loading the model", err.message);
    return 0;
  }
  return (jlong)(intptr_t)model;
}

JNIEXPORT void JNICALL Java_kiln_KilnJni_releaseModel(JNIEnv* env, jclass cls, jlong model) {
  (void)env;
  (void)cls;
  kiln_model_release((kiln_model_t*)(intptr_t)model);
}

JNIEXPORT jlong JNICALL Java_kiln_KilnJni_createSession(JNIEnv* env, jclass cls, jlong model, jint threads) {
  (void)cls;
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = threads;
  kiln_error_t err;
  kiln_session_t* session = NULL;
  kiln_status_t st = kiln_session_create((kiln_model_t*)(intptr_t)model, &so, &session, &err);
  if (st != KILN_OK) {
    ThrowStatus(env, st, "creating a session", err.message);
    return 0;
  }
  return (jlong)(intptr_t)session;
}

JNIEXPORT void JNICALL Java_kiln_KilnJni_releaseSession(JNIEnv* env, jclass cls, jlong session) {
  (void)env;
  (void)cls;
  kiln_session_release((kiln_session_t*)(intptr_t)session);
}

/* kiln_session_set_image_rgb of packed RGB rows; a KilnException when it fails. */
static void SetImage(JNIEnv* env, jlong session, const uint8_t* rgb, jint width, jint height) {
  kiln_error_t err;
  kiln_status_t st =
      kiln_session_set_image_rgb((kiln_session_t*)(intptr_t)session, rgb, width, height, (size_t)width * 3, &err);
  if (st != KILN_OK) ThrowStatus(env, st, "setting the image", err.message);
}

JNIEXPORT void JNICALL Java_kiln_KilnJni_setImageRgb(JNIEnv* env, jclass cls, jlong session, jbyteArray rgb,
                                                      jint width, jint height) {
  (void)cls;
  if (width <= 0 || height <= 0 || (*env)->GetArrayLength(env, rgb) < (jsize)((size_t)width * (size_t)height * 3)) {
    ThrowStatus(env, KILN_ERROR_INVALID_ARGUMENT, "setting the image", "rgb holds fewer than width x height x 3 bytes");
    return;
  }
  jbyte* pixels = (*env)->GetByteArrayElements(env, rgb, NULL);
  if (pixels == NULL) return;
  SetImage(env, session, (const uint8_t*)pixels, width, height);
  (*env)->ReleaseByteArrayElements(env, rgb, pixels, JNI_ABORT);
}

JNIEXPORT void JNICALL Java_kiln_KilnJni_setImageArgb(JNIEnv* env, jclass cls, jlong session, jintArray argb,
                                                       jint width, jint height) {
  (void)cls;
  if (width <= 0 || height <= 0 || (*env)->GetArrayLength(env, argb) < (jsize)((size_t)width * (size_t)height)) {
    ThrowStatus(env, KILN_ERROR_INVALID_ARGUMENT, "setting the image", "argb holds fewer than width x height pixels");
    return;
  }
  const size_t n = (size_t)width * (size_t)height;
  uint8_t* rgb = (uint8_t*)malloc(n * 3);
  if (rgb == NULL) {
    ThrowStatus(env, KILN_ERROR_OUT_OF_MEMORY, "setting the image", "out of memory");
    return;
  }
  jint* pixels = (*env)->GetIntArrayElements(env, argb, NULL);
  if (pixels == NULL) {
    free(rgb);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint32_t p = (uint32_t)pixels[i];
    rgb[3 * i] = (uint8_t)(p >> 16);
    rgb[3 * i + 1] = (uint8_t)(p >> 8);
    rgb[3 * i + 2] = (uint8_t)p;
  }
  (*env)->ReleaseIntArrayElements(env, argb, pixels, JNI_ABORT);
  SetImage(env, session, rgb, width, height);
  free(rgb);
}

/* The answer's bytes as they arrive, and the listener they are handed to. */
typedef struct Answer {
  JNIEnv* env;
  jobject listener;
  jmethodID on_token;
  char* bytes;
  size_t length, capacity;
  int failed;
} Answer;

static int OnToken(void* user, int32_t token, const char* text, size_t length) {
  Answer* a = (Answer*)user;
  if (a->length + length + 1 > a->capacity) {
    size_t capacity = (a->length + length + 1) * 2;
    char* grown = (char*)realloc(a->bytes, capacity);
    if (grown == NULL) {
      a->failed = 1;
      return 1;
    }
    a->bytes = grown;
    a->capacity = capacity;
  }
  memcpy(a->bytes + a->length, text, length);
  a->length += length;
  if (a->listener == NULL) return 0;
  JNIEnv* env = a->env;
  jstring piece = Utf8String(env, text, length);
  if (piece == NULL) return 1;
  jboolean stop = (*env)->CallBooleanMethod(env, a->listener, a->on_token, (jint)token, piece);
  (*env)->DeleteLocalRef(env, piece);
  return (*env)->ExceptionCheck(env) || stop ? 1 : 0;
}

/* The listener's method, or 0 with a Java exception pending. */
static int BeginAnswer(JNIEnv* env, jobject listener, Answer* a) {
  memset(a, 0, sizeof *a);
  a->env = env;
  a->listener = listener;
  if (listener != NULL) {
    jclass lc = (*env)->GetObjectClass(env, listener);
    a->on_token = (*env)->GetMethodID(env, lc, "onToken", "(ILjava/lang/String;)Z");
    if (a->on_token == NULL) return 0;
  }
  return 1;
}

/* The answer as a String, or NULL with the listener's exception or a KilnException. */
static jstring EndAnswer(JNIEnv* env, Answer* a, kiln_status_t st, const kiln_error_t* err) {
  jstring answer = NULL;
  if ((*env)->ExceptionCheck(env)) {
    /* the listener threw: that exception propagates */
  } else if (a->failed) {
    ThrowStatus(env, KILN_ERROR_OUT_OF_MEMORY, "generating", "out of memory");
  } else if (st != KILN_OK && st != KILN_ERROR_CANCELLED) {
    ThrowStatus(env, st, "generating", err->message);
  } else {
    answer = Utf8String(env, a->bytes != NULL ? a->bytes : "", a->length);
  }
  free(a->bytes);
  return answer;
}

static void Options(kiln_generate_options_t* go, jint max_new_tokens, Answer* a) {
  kiln_generate_options_init(go);
  go->max_new_tokens = max_new_tokens;
  go->on_token = OnToken;
  go->user = a;
}

JNIEXPORT jstring JNICALL Java_kiln_KilnJni_generate(JNIEnv* env, jclass cls, jlong session, jstring prompt,
                                                     jint max_new_tokens, jobject listener) {
  (void)cls;
  Answer a;
  if (!BeginAnswer(env, listener, &a)) return NULL;
  char* p = Utf8Bytes(env, prompt);
  if (p == NULL) return NULL;
  kiln_generate_options_t go;
  Options(&go, max_new_tokens, &a);
  kiln_error_t err;
  kiln_status_t st = kiln_session_generate((kiln_session_t*)(intptr_t)session, p, &go, &err);
  free(p);
  return EndAnswer(env, &a, st, &err);
}

JNIEXPORT jstring JNICALL Java_kiln_KilnJni_chat(JNIEnv* env, jclass cls, jlong session, jobjectArray roles,
                                                 jobjectArray contents, jint image_message, jint max_new_tokens,
                                                 jobject listener) {
  (void)cls;
  jsize n = roles != NULL ? (*env)->GetArrayLength(env, roles) : 0;
  if (n == 0 || contents == NULL || (*env)->GetArrayLength(env, contents) != n) {
    ThrowStatus(env, KILN_ERROR_INVALID_ARGUMENT, "chat", "roles and contents must be non-empty and equally long");
    return NULL;
  }
  Answer a;
  if (!BeginAnswer(env, listener, &a)) return NULL;
  kiln_chat_message_t* m = (kiln_chat_message_t*)calloc((size_t)n, sizeof *m);
  jsize made = 0;
  int ok = m != NULL;
  for (; ok && made < n; ++made) {
    jstring role = (jstring)(*env)->GetObjectArrayElement(env, roles, made);
    jstring content = (jstring)(*env)->GetObjectArrayElement(env, contents, made);
    m[made].role = role != NULL ? Utf8Bytes(env, role) : NULL;
    m[made].content = content != NULL ? Utf8Bytes(env, content) : NULL;
    m[made].image = made == image_message;
    (*env)->DeleteLocalRef(env, role);
    (*env)->DeleteLocalRef(env, content);
    ok = !(*env)->ExceptionCheck(env);
  }
  kiln_status_t st = KILN_ERROR_OUT_OF_MEMORY;
  kiln_error_t err;
  memset(&err, 0, sizeof err);
  if (ok) {
    kiln_generate_options_t go;
    Options(&go, max_new_tokens, &a);
    st = kiln_session_chat((kiln_session_t*)(intptr_t)session, m, (size_t)n, &go, &err);
  } else if (m == NULL) {
    snprintf(err.message, sizeof err.message, "out of memory");
  }
  for (jsize i = 0; m != NULL && i < made; ++i) {
    free((void*)m[i].role);
    free((void*)m[i].content);
  }
  free(m);
  if (!ok && (*env)->ExceptionCheck(env)) {
    free(a.bytes);
    return NULL;
  }
  return EndAnswer(env, &a, st, &err);
}

JNIEXPORT jdouble JNICALL Java_kiln_KilnJni_lastTimeToFirstTokenMs(JNIEnv* env, jclass cls, jlong session) {
  (void)env;
  (void)cls;
  kiln_stats_t stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  if (kiln_session_get_stats((const kiln_session_t*)(intptr_t)session, &stats) != KILN_OK) return -1.0;
  return stats.ttft_ms;
}

JNIEXPORT void JNICALL Java_kiln_KilnJni_setPressure(JNIEnv* env, jclass cls, jlong model, jint kind, jint level) {
  (void)cls;
  kiln_status_t st = kiln_model_set_pressure((kiln_model_t*)(intptr_t)model, kind, level);
  if (st != KILN_OK) ThrowStatus(env, st, "setting the pressure", NULL);
}
