# lit configuration for Kiln's IR tests (run through the generated lit.site.cfg.py).
import os

import lit.formats

config.name = "kiln"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.kiln_binary_dir, "tests", "lit")

# Kiln's tools first, then LLVM's FileCheck/not/count.
config.environment["PATH"] = os.pathsep.join(
    [config.kiln_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])

config.substitutions.append(("%kiln_src", config.kiln_source_dir))
config.substitutions.append(("%python", config.python_executable))
