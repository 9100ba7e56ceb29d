//===- Calibration.h - running the model at compile time ---------*- C++ -*-===//
//
// Calibration runs the model through Kiln's own runtime (host build) on calibration
// inputs — image + prompt pairs — to measure what the precision decisions need:
//
//  * activation statistics: for every quantisable weight, the Hessian X^T X / n of
//    the inputs it multiplies (for error-compensated GPTQ rounding);
//  * sensitivity: for every quantisable weight and candidate encoding, the mean KL
//    divergence of the next-token distributions when that weight alone is stored in
//    that encoding, against the unquantised model, over the calibration set;
//  * routing: for every mixture-of-experts router, how often each expert is chosen
//    and the routing weight it receives (for expert pruning).
//
// It also scores a model's answers (teacher-forced exact match), to compare a
// pruned model with the unpruned one on held-out samples.
//
// Candidates are measured with the runtime's real kernels (int8 activations
// included): the weight's bytes and encoding are swapped in the loaded model, nothing
// is simulated.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_CALIBRATION_CALIBRATION_H
#define KILN_COMPILER_CALIBRATION_CALIBRATION_H

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

namespace kiln::calib {

struct Sample {
  std::string image;  // path, "" for text only
  std::string prompt;
  std::string answer; // optional: scored positions then cover the answer too
};

/// Reads calibration inputs: a JSONL file of {"image", "prompt"[, "answer"]}
/// (image paths relative to the file), or a directory holding one *.jsonl file.
llvm::Expected<std::vector<Sample>> readCalibrationSet(llvm::StringRef path);

/// How a mixture-of-experts router routed the calibration tokens: per expert (router
/// row), how many tokens chose it among their top k, and the sum of the routing
/// weights it received (its share of the layer's output).
struct RoutingStats {
  int64_t tokens = 0;
  std::vector<int64_t> selected;
  std::vector<double> mass;
  // experts x experts, row-major: the cosine similarity of two experts' weights
  // (gate, up and down as one vector), for merging a pruned expert into its nearest.
  std::vector<double> similarity;
};

struct Options {
  std::vector<Sample> samples;
  std::vector<std::string> candidates;  // encoding labels ("int4_g32", ...)
  bool collectHessians = false;         // for GPTQ
  bool collectRouting = false;          // for expert pruning
  bool collectSimilarity = false;       // with collectRouting: the experts' similarity (merging)
  bool gptq = false;                    // measure candidates with GPTQ rounding
  int threads = 0;
  bool progress = false;                // draw progress on stderr
};

struct Result {
  /// weight -> candidate label -> mean KL (nats per scored position).
  std::map<std::string, std::map<std::string, double>> sensitivity;
  /// weight -> [cols, cols] row-major Hessian (when collected).
  std::map<std::string, std::vector<double>> hessians;
  int scoredPositions = 0;
  /// router weight -> routing statistics (when collected).
  std::map<std::string, RoutingStats> routing;
};

/// The default candidate encodings.
std::vector<std::string> defaultCandidates();

/// Calibrates `module` (imported and lowered; weights in any encoding — they are
/// measured from the checkpoint's values). Errors are diagnostics on the module.
mlir::LogicalResult calibrate(mlir::ModuleOp module, const Options& options, Result* result);

/// Teacher-forced answer accuracy: a sample is right when every token of its answer
/// is the most likely next token after the prompt and the answer's earlier tokens
/// (what greedy decoding produces).
struct Evaluation {
  int samples = 0;
  int correct = 0;
  double answerNll = 0;  // mean negative log-likelihood per answer token (nats)
  double accuracy() const { return samples > 0 ? 100.0 * correct / samples : 0.0; }
};

/// Scores `module` (lowered, any encodings: run as f32) on `samples`, which must all
/// have answers.
mlir::LogicalResult evaluateAnswers(mlir::ModuleOp module, const std::vector<Sample>& samples, int threads,
                                    Evaluation* out);

/// A digest of the checkpoint content the module reads (configs and every weight's
/// bytes, xxh3): the cache key's first part.
llvm::Expected<std::string> sourceHash(mlir::ModuleOp module);

/// Cache of sensitivities, keyed by what determines them (the source checkpoint's
/// hash, the calibration set, the candidates and the quantiser). JSON files in `dir`.
std::string cacheKey(llvm::StringRef sourceHash, const Options& options);
bool loadCache(llvm::StringRef dir, llvm::StringRef key, Result* result);
void saveCache(llvm::StringRef dir, llvm::StringRef key, const Result& result);

} // namespace kiln::calib

#endif // KILN_COMPILER_CALIBRATION_CALIBRATION_H
