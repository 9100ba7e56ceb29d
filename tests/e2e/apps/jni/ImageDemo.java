import kiln.KilnJni;

/**
 * Answers about an image through the JNI binding, as an Android app would from a Bitmap:
 * usage ImageDemo MODEL.kiln PROMPT MAX_NEW_TOKENS. The image is width 40 x height 30
 * ARGB_8888 pixels: red (7x + 3y) % 256, green (5x * y) % 256, blue (x ^ y) * 9 % 256
 * (tests/e2e/test_jni.py writes the same pixels to a PNG for kiln-run).
 */
public final class ImageDemo {
  public static void main(String[] args) {
    System.loadLibrary("kiln_jni");
    long model = KilnJni.loadModel(args[0]);
    long session = KilnJni.createSession(model, 2);
    int w = 40, h = 30;
    int[] argb = new int[w * h];
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        argb[y * w + x] = 0xFF000000 | ((7 * x + 3 * y) % 256) << 16 | ((5 * x * y) % 256) << 8 | ((x ^ y) * 9 % 256);
    KilnJni.setImageArgb(session, argb, w, h);
    System.out.println("answer: [" + KilnJni.generate(session, args[1], Integer.parseInt(args[2]), null) + "]");
    // A system message, then the question with the image (LLaVA-1.5's template).
    System.out.println("chat: [" + KilnJni.chat(session, new String[] {"system", "user"},
                                               new String[] {"Be brief.", args[1]}, 1, Integer.parseInt(args[2]), null)
                       + "]");
    try {
      KilnJni.setImageArgb(session, argb, w, h + 1);
      System.out.println("no exception");
    } catch (KilnJni.KilnException e) {
      System.out.println("error " + e.status + ": " + e.getMessage());
    }
    KilnJni.releaseSession(session);
    KilnJni.releaseModel(model);
  }
}
