package kiln;

/**
 * The Kiln C API for Java and Kotlin (Android), through kiln_jni.c: handles are the C
 * pointers as longs; a failed call throws KilnException with the runtime's message and
 * status. Load the native library first: System.loadLibrary("kiln_jni").
 */
public final class KilnJni {
  private KilnJni() {}

  /** Thrown for a kiln_status_t other than KILN_OK. */
  public static final class KilnException extends RuntimeException {
    public final int status;

    public KilnException(int status, String message) {
      super(message);
      this.status = status;
    }
  }

  /** Receives each piece of the answer as it is generated; return true to stop. */
  public interface TokenListener {
    boolean onToken(int token, String text);
  }

  /** kiln_version_string(). */
  public static native String version();

  /** kiln_model_load with default options; the handle of the model. */
  public static native long loadModel(String path);

  public static native void releaseModel(long model);

  /** kiln_session_create; threads 0: the performance cores. */
  public static native long createSession(long model, int threads);

  public static native void releaseSession(long session);

  /**
   * kiln_session_set_image_rgb: `rgb` holds height rows of width RGB triplets, packed (an
   * Android Bitmap's ARGB_8888 pixels converted by the app).
   */
  public static native void setImageRgb(long session, byte[] rgb, int width, int height);

  /**
   * kiln_session_set_image_rgb from ARGB_8888 pixels, as Android's Bitmap.getPixels fills
   * them (stride = width; alpha ignored).
   */
  public static native void setImageArgb(long session, int[] argb, int width, int height);

  /** kiln_session_generate, greedy, at most maxNewTokens (0: the model's default); the answer. */
  public static native String generate(long session, String prompt, int maxNewTokens, TokenListener listener);

  /**
   * kiln_session_chat, greedy: the conversation roles[i] ("system", "user", "assistant")
   * with contents[i], in the model's chat template; the last message is the user's.
   * imageMessage: the index of the message the session's image belongs to (-1: none).
   * Pass the whole conversation each turn, earlier answers as "assistant" messages: the
   * part the KV cache holds is not computed again.
   */
  public static native String chat(long session, String[] roles, String[] contents, int imageMessage,
                                   int maxNewTokens, TokenListener listener);

  /** kiln_session_get_stats().ttft_ms of the last answer. */
  public static native double lastTimeToFirstTokenMs(long session);

  /** kiln_model_set_pressure (kind: 0 memory, 1 thermal, 2 battery; level 0-3). */
  public static native void setPressure(long model, int kind, int level);
}
