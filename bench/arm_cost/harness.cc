// The program bench/arm_cost.py runs under qemu-aarch64 to count the instructions of
// one generated int8-activation matmul (W4A8 int4 g32 or W8A8 int8, packed as
// kiln-compile stores them: int4_p128k4 on SME2, int4_p16k16 with i8mm, else int4_p16k8; int8_p16k4), with the
// activations' dynamic quantisation beside it.
//
//   harness quant|matmul|check|none M N K int4|int8 [calls [group]]
//
// Builds seeded random weights (int4: groups of `group` columns, default 32) and
// activations for [M, K] x [N, K]^T, packs the
// weight into the layout the generated kernel reads (formats/encoding.h), and then
// calls, `calls` times (default 1), one thread, the whole range of output channels:
//   quant  - the runtime's row quantiser beside generated kernels on Arm
//            (kiln_uk_lhs_quant_qai8dx_f32_arm_neon)
//   matmul - the generated matmul kernel of the linked kernel library
//   none   - nothing (the set-up alone)
//   check  - both once, and the reference matmul on the row-major weight: prints the
//            largest difference and exits 1 above 1e-4 of the largest output
// arm_cost.py counts the instructions of runs with different `calls` and takes the
// difference, so that the set-up cancels. The kernel library is the one kiln-compile
// --emit=static-library wrote; KILN_KERNELS names it (-DKILN_KERNELS=kiln_kernels_x).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "formats/encoding.h"
#include "formats/ukernel_abi.h"
#include "kiln/kiln.h"

extern "C" {
extern const kiln_kernel_library_t KILN_KERNELS;
size_t kiln_uk_matmul_scratch_ref(int64_t K);
void kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                         int64_t n_end, float* scratch);
void kiln_uk_lhs_quant_qai8dx_f32_arm_neon(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                           int64_t row_end);
}

namespace {

namespace fmt = kiln::format;

int Usage() {
  std::fprintf(stderr, "usage: harness quant|matmul|check|none M N K int4|int8 [calls [group]]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) return Usage();
  const std::string mode = argv[1], enc = argv[5];
  const int64_t M = std::atoll(argv[2]), K = std::atoll(argv[4]);
  int64_t N = std::atoll(argv[3]);
  const int calls = argc > 6 ? std::atoi(argv[6]) : 1;
  const int64_t group = argc > 7 ? std::atoll(argv[7]) : 32;  // int4's group
  const bool int4 = enc == "int4";
  if ((!int4 && enc != "int8") || M <= 0 || N <= 0 || K <= 0 || K % 32 != 0 || calls < 0 || group <= 0 ||
      group % 4 != 0 || K % group != 0)
    return Usage();

  // The generated kernel for this encoding's packed layout: the shortest name that
  // reads it (a model with both layouts also has a dispatcher reading either). int4:
  // int4_p128k4 where the library has it (SME2 targets), else int4_p16k16 (i8mm), else
  // int4_p16k8.
  kiln_uk_matmul_fn kernel = nullptr;
  std::string chosen;
  auto find = [&](const char* layout) {
    for (uint32_t i = 0; i < KILN_KERNELS.count; ++i) {
      std::string name = KILN_KERNELS.names[i];
      if (name.rfind("kiln_uk_matmul_", 0) == 0 && name.find(layout) != std::string::npos &&
          (chosen.empty() || name.size() < chosen.size())) {
        kernel = reinterpret_cast<kiln_uk_matmul_fn>(KILN_KERNELS.functions[i]);
        chosen = name;
      }
    }
  };
  const bool lut = int4 && (find("_p128k4"), kernel != nullptr);
  const bool pairs = int4 && !lut && (find("_p16k16"), kernel != nullptr);
  const char* layout = !int4 ? "_p16k4" : lut ? "_p128k4" : pairs ? "_p16k16" : "_p16k8";
  if (!kernel) find(layout);
  if (!kernel) {
    std::fprintf(stderr, "harness: the kernel library has no matmul reading %s\n", layout + 1);
    return 1;
  }
  if (mode == "check") std::printf("kernel %s\n", chosen.c_str());
  // int4_p16k16 holds whole panels of 16 rows only: a check's N is rounded down.
  const uint8_t layoutId = lut ? fmt::kLayoutInt4P128K4 : pairs ? fmt::kLayoutInt4P16K16
                           : int4 ? fmt::kLayoutInt4P16K8 : fmt::kLayoutInt8P16K4;
  if (pairs && N % 16 != 0) {
    if (mode != "check" || N < 16) return Usage();
    N = N / 16 * 16;
  }

  // Weight: codes, then scales (int4: f16 per row and group; int8: f32 per row).
  fmt::EncodingSpec spec;
  spec.id = int4 ? fmt::kEncINT4 : fmt::kEncINT8;
  spec.group = int4 ? static_cast<uint32_t>(group) : 0;
  const uint64_t bytes = fmt::StorageBytes(spec, N, K);
  std::vector<uint8_t> plain(bytes), packed(bytes);
  // A cheap generator (xorshift64): the set-up's instructions are counted too and
  // only cancel out, so they are kept few.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const uint64_t codes = int4 ? N * K / 2 : N * K;
  for (uint64_t i = 0; i < codes; i += 8) {
    uint64_t word = next();
    std::memcpy(plain.data() + i, &word, codes - i < 8 ? codes - i : 8);
  }
  if (!int4)  // int8 codes in [-127, 127]
    for (uint64_t i = 0; i < codes; ++i)
      if (plain[i] == 0x80) plain[i] = 0x81;
  if (int4) {
    for (int64_t i = 0; i < N * (K / group); ++i) {
      uint16_t h = kiln::numeric::F32ToF16(0.01f + 0.001f * (i % 7));
      std::memcpy(plain.data() + codes + 2 * i, &h, 2);
    }
    fmt::RepackLayout(true, layoutId, spec, plain.data(), N, K, packed.data());
  } else {
    for (int64_t i = 0; i < N; ++i) {
      float s = 0.01f + 0.001f * (i % 7);
      std::memcpy(plain.data() + codes + 4 * i, &s, 4);
    }
    fmt::RepackInt8P16K4(true, plain.data(), N, K, packed.data());
  }
  std::vector<float> x(M * K), xs(M), y(M * N), scratch(kiln_uk_matmul_scratch_ref(K) + 64);
  std::vector<int8_t> xq(M * K);
  for (float& v : x) v = static_cast<float>(static_cast<int64_t>(next() >> 40) - (1 << 23)) / (1 << 23);

  kiln_uk_quant_rows_params_t q = {x.data(), K, K, xq.data(), xs.data()};
  kiln_uk_matmul_params_t p{};
  p.x = x.data();
  p.ldx = K;
  p.xq = xq.data();
  p.xs = xs.data();
  p.M = M;
  p.N = N;
  p.K = K;
  p.w.data = packed.data();
  p.w.rows = N;
  p.w.cols = K;
  p.w.encoding = spec.id;
  p.w.symmetric = 1;
  p.w.int8_activations = 1;
  p.w.layout = layoutId;
  p.w.group = spec.group;
  p.y = y.data();
  p.ldy = N;
  kiln_uk_lhs_quant_qai8dx_f32_arm_neon(&q, 0, M);

  if (mode == "quant") {
    for (int c = 0; c < calls; ++c) kiln_uk_lhs_quant_qai8dx_f32_arm_neon(&q, 0, M);
  } else if (mode == "matmul") {
    for (int c = 0; c < calls; ++c) kernel(&p, 0, N, scratch.data());
  } else if (mode == "check") {
    kernel(&p, 0, N, scratch.data());
    std::vector<float> ref(M * N);
    kiln_uk_matmul_params_t r = p;
    r.w.data = plain.data();
    r.w.layout = 0;
    r.y = ref.data();
    kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(&r, 0, N, scratch.data());
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < M * N; ++i) {
      worst = std::fmax(worst, std::fabs(static_cast<double>(y[i]) - ref[i]));
      largest = std::fmax(largest, std::fabs(static_cast<double>(ref[i])));
    }
    std::printf("check %s M=%lld N=%lld K=%lld group %lld: max |generated - reference| %.3g, max |reference| %.3g\n",
                enc.c_str(), static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                static_cast<long long>(int4 ? group : 0), worst, largest);
    return worst <= 1e-4 * largest ? 0 : 1;
  } else if (mode != "none") {
    return Usage();
  }
  // Keep the outputs observable.
  double sum = 0;
  for (float v : y) sum += v;
  std::printf("%s %s calls=%d sum=%g\n", mode.c_str(), enc.c_str(), calls, sum);
  return 0;
}
