# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""Where _library looks for the plug-in and for a CUDA runtime the loader does not find, in a
checkout and in an installed package (ctest python_wheel installs a real wheel)."""
import importlib.util
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

from cistern import _library


def load_copy(folder):
    """_library.py copied to folder/cistern/ and imported from there, as site-packages has it."""
    package = os.path.join(folder, "cistern")
    os.makedirs(package)
    shutil.copy(_library.__file__, package)
    spec = importlib.util.spec_from_file_location("installed_library",
                                                  os.path.join(package, "_library.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LibraryTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.folder)
        environment = mock.patch.dict(os.environ)
        environment.start()
        self.addCleanup(environment.stop)
        os.environ.pop("CISTERN_PLUGIN_LIBRARY", None)

    def test_the_environment_alone_when_set(self):
        os.environ["CISTERN_PLUGIN_LIBRARY"] = "/x/libcistern_plugin.so"
        self.assertEqual(_library.candidates(), ["/x/libcistern_plugin.so"])

    def test_installed_package_looks_next_to_itself_then_the_loader(self):
        installed = load_copy(os.path.join(self.folder, "site-packages"))
        here = os.path.join(os.path.realpath(self.folder), "site-packages", "cistern")
        self.assertEqual([os.path.realpath(c) if os.sep in c else c
                          for c in installed.candidates()],
                         [os.path.join(here, "libcistern_plugin.so"), "libcistern_plugin.so"])

    def test_checkout_looks_in_build_folders_after_the_package(self):
        found = _library.candidates()
        package = os.path.dirname(os.path.abspath(_library.__file__))
        self.assertEqual(found[0], os.path.join(package, "libcistern_plugin.so"))
        self.assertEqual(found[-1], "libcistern_plugin.so")
        for middle in found[1:-1]:
            self.assertTrue(middle.endswith(os.path.join("src", "plugin", "libcistern_plugin.so")))

    def test_cuda_runtime_from_an_nvidia_wheel(self):
        lib = os.path.join(self.folder, "nvidia", "cu99", "lib")
        os.makedirs(lib)
        open(os.path.join(lib, "libcudart.so.99"), "w").close()
        with mock.patch.object(sys, "path", [self.folder]), \
                mock.patch.dict(os.environ, {"CUDA_HOME": "", "CUDA_PATH": ""}):
            self.assertEqual(_library.cuda_runtime_candidates("libcudart.so.99"),
                             [os.path.join(lib, "libcudart.so.99")])

    def test_only_a_missing_cuda_runtime_is_retried(self):
        self.assertFalse(_library._preload_cuda_runtime(OSError("libfoo.so: cannot open")))
        with mock.patch.object(_library, "cuda_runtime_candidates", return_value=[]):
            self.assertFalse(_library._preload_cuda_runtime(OSError(
                "libcudart.so.99: cannot open shared object file: No such file or directory")))


if __name__ == "__main__":
    unittest.main()
