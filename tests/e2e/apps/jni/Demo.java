import kiln.KilnJni;

/** Answers a prompt through the JNI binding: usage Demo MODEL.kiln PROMPT MAX_NEW_TOKENS. */
public final class Demo {
  public static void main(String[] args) {
    System.loadLibrary("kiln_jni");
    System.out.println("kiln " + KilnJni.version());
    long model = KilnJni.loadModel(args[0]);
    long session = KilnJni.createSession(model, 1);
    StringBuilder streamed = new StringBuilder();
    String answer = KilnJni.generate(session, args[1], Integer.parseInt(args[2]), (token, text) -> {
      streamed.append(text);
      return false;
    });
    System.out.println("answer: [" + answer + "]");
    System.out.println("streamed equals answer: " + streamed.toString().equals(answer));
    System.out.println("ttft ms: " + KilnJni.lastTimeToFirstTokenMs(session));
    // Stopping from the listener after the first token.
    String first = KilnJni.generate(session, args[1], Integer.parseInt(args[2]), (token, text) -> true);
    System.out.println("stopped: [" + first + "]");
    // One user message through chat is the same prompt; this model has no chat template,
    // so a system message is refused by name.
    String chatted = KilnJni.chat(session, new String[] {"user"}, new String[] {args[1]}, -1,
                                  Integer.parseInt(args[2]), null);
    System.out.println("chat equals answer: " + chatted.equals(answer));
    try {
      KilnJni.chat(session, new String[] {"system", "user"}, new String[] {"Be brief.", args[1]}, -1, 4, null);
      System.out.println("no chat exception");
    } catch (KilnJni.KilnException e) {
      System.out.println("chat error " + e.status + ": " + e.getMessage());
    }
    KilnJni.setPressure(model, 0, 0);
    try {
      KilnJni.loadModel(args[0] + ".missing");
      System.out.println("no exception");
    } catch (KilnJni.KilnException e) {
      System.out.println("error " + e.status + ": " + e.getMessage());
    }
    KilnJni.releaseSession(session);
    KilnJni.releaseModel(model);
  }
}
