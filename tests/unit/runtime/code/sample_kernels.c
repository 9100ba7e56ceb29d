/* Freestanding sample kernels for the code-segment loader (code_loader_test.cc).
 * Built at build time into relocatable ELF objects for the target CPU; each
 * function makes the compiler emit a kind of relocation the loader must apply.
 *
 * Variants (-D): KILN_SAMPLE_EXTERN adds a call to a function defined elsewhere
 * (the loader must refuse it), KILN_SAMPLE_WRITABLE a writable global (ditto). */

/* Squares, read through a runtime index: a PC-relative reference to .rodata. */
static const float kSquares[64] = {
    0,    1,    4,    9,    16,   25,   36,   49,   64,   81,   100,  121,  144,
    169,  196,  225,  256,  289,  324,  361,  400,  441,  484,  529,  576,  625,
    676,  729,  784,  841,  900,  961,  1024, 1089, 1156, 1225, 1296, 1369, 1444,
    1521, 1600, 1681, 1764, 1849, 1936, 2025, 2116, 2209, 2304, 2401, 2500, 2601,
    2704, 2809, 2916, 3025, 3136, 3249, 3364, 3481, 3600, 3721, 3844, 3969};

/* A local function kept out of line: a call relocation (across sections when
 * built with -ffunction-sections). */
__attribute__((noinline)) static int scale_add(int x, int k) { return x * k + 3; }

int kiln_sample_call(int x) { return scale_add(x, 7) + scale_add(x + 1, 5); }

float kiln_sample_square(int i) { return kSquares[i & 63]; }

/* A tail call of the local function (AArch64 R_AARCH64_JUMP26). */
int kiln_sample_tail(int x) { return scale_add(x, 2); }

/* Weak constants may be replaced at link time, so the compiler loads them rather
 * than folding their values (hidden: directly, not through a GOT): on AArch64 with
 * ADRP + LDR [x, :lo12:] (R_AARCH64_LDST32/64_ABS_LO12_NC against the symbols). */
__attribute__((weak, visibility("hidden"))) const float kiln_sample_bias = 0.5f;
__attribute__((weak, visibility("hidden"))) const double kiln_sample_gain = 2.0;
double kiln_sample_affine(double x) { return x * kiln_sample_gain + kiln_sample_bias; }

/* Enough dissimilar cases for a jump table (x86-64: PC32 relocations from
 * .rodata into .text). */
int kiln_sample_switch(int op, int a, int b) {
  switch (op) {
#include "sample_switch.inc"
  }
}

struct kiln_sample_stats {
  float sum;
  float max;
  int count;
  int argmax;
};

/* Sum, maximum and its index of x[0, n) (a constant-pool float for -inf). */
void kiln_sample_reduce(const float* x, int n, struct kiln_sample_stats* out) {
  float sum = 0.0f, max = -__builtin_inff();
  int argmax = -1;
  for (int i = 0; i < n; ++i) {
    sum += x[i];
    if (x[i] > max) {
      max = x[i];
      argmax = i;
    }
  }
  out->sum = sum;
  out->max = max;
  out->count = n;
  out->argmax = argmax;
}

/* Calls of exported functions: relocations against global symbols (x86-64
 * R_X86_64_PLT32, AArch64 R_AARCH64_CALL26). */
int kiln_sample_chain(int x) {
  return kiln_sample_call(x) + kiln_sample_switch(x & 7, x, 3) + (int)kiln_sample_square(x);
}

#ifdef KILN_SAMPLE_EXTERN
int external_helper(int x);
int kiln_sample_extern(int x) { return external_helper(x) + 1; }
#endif

#ifdef KILN_SAMPLE_WRITABLE
static int counter = 1;
int kiln_sample_bump(void) { return ++counter; }
#endif
