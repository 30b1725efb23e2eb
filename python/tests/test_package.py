# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The package itself: importable with the standard library only, finds the library, and says
clearly what is missing when torch or CuPy (or a GPU) is not there. The framework parts that
need a GPU skip themselves; scripts/gpu-plugins.sh runs them on a GPU machine."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

import cistern
from cistern import _library

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_CUPY = importlib.util.find_spec("cupy") is not None


def torch_has_gpu():
    if not HAS_TORCH:
        return False
    import torch
    return torch.cuda.is_available()


class PackageTest(unittest.TestCase):
    def test_import_needs_only_the_standard_library(self):
        code = ("import sys, cistern, cistern.torch, cistern.cupy; "
                "print(sorted(m for m in ('torch', 'cupy', 'numpy') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, env=dict(os.environ)).stdout
        self.assertEqual(out.strip(), "[]")

    def test_finds_the_library_from_the_environment(self):
        self.assertEqual(_library.candidates()[0], os.environ["CISTERN_PLUGIN_LIBRARY"])
        self.assertTrue(cistern.library_path().endswith("libcistern_plugin.so"))
        self.assertEqual(cistern.version(), "0.1.0")

    def test_missing_library_is_explained(self):
        code = "import cistern; cistern.load()"
        env = dict(os.environ, CISTERN_PLUGIN_LIBRARY="/nonexistent/libcistern_plugin.so")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("/nonexistent/libcistern_plugin.so (missing)", result.stderr)

    def test_every_script_compiles(self):
        # The GPU scripts run only where a GPU is lent: a syntax error must show up here first.
        import glob
        import py_compile
        scripts = glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                         "*.py"))
        self.assertGreater(len(scripts), 5)
        with tempfile.TemporaryDirectory() as folder:
            for script in scripts:
                py_compile.compile(script, cfile=os.path.join(folder, "x.pyc"), doraise=True)

    @unittest.skipIf(HAS_TORCH, "torch is installed")
    def test_torch_missing_is_explained(self):
        import cistern.torch
        with self.assertRaises(ImportError) as caught:
            cistern.torch.enable()
        self.assertIn("cistern.torch needs PyTorch", str(caught.exception))

    @unittest.skipIf(HAS_CUPY, "cupy is installed")
    def test_cupy_missing_is_explained(self):
        import cistern.cupy
        with self.assertRaises(ImportError) as caught:
            cistern.cupy.enable()
        self.assertIn("cistern.cupy needs CuPy", str(caught.exception))

    @unittest.skipUnless(torch_has_gpu(), "needs torch with a CUDA GPU (scripts/gpu-plugins.sh)")
    def test_torch_allocations_go_to_cistern(self):
        # In a child process: the allocator must be swapped before any CUDA allocation.
        code = ("import torch, cistern, cistern.torch; cistern.torch.enable(); "
                "x = torch.ones(1024, device='cuda'); torch.cuda.synchronize(); "
                "print(cistern.torch.memory_stats()['allocated_bytes.all.current'])")
        env = dict(os.environ, CISTERN_BACKEND="cuda")
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, env=env).stdout
        self.assertEqual(out.strip(), "4096")


if __name__ == "__main__":
    unittest.main()
