# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The one thing pyproject.toml cannot say: a wheel that carries libcistern_plugin.so (placed in
cistern/ by scripts/build-wheel.sh) is tagged for this platform, py3-none-<platform>: the library
is machine code, but it is loaded with ctypes, so any Python 3 can use it. Without the library
the package stays pure Python (py3-none-any), as for a development install."""
import os

from setuptools import Distribution, setup

HERE = os.path.dirname(os.path.abspath(__file__))
CARRIES_LIBRARY = os.path.exists(os.path.join(HERE, "cistern", "libcistern_plugin.so"))


class PlatformDistribution(Distribution):
    """Machine code inside: the files go to platlib and the wheel is not pure."""

    def has_ext_modules(self):
        return True


commands = {}
if CARRIES_LIBRARY:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """bdist_wheel with this platform's tag but no Python or ABI tag."""

        def get_tag(self):
            _, _, platform = super().get_tag()
            return "py3", "none", platform

    commands["bdist_wheel"] = PlatformWheel

setup(cmdclass=commands, distclass=PlatformDistribution if CARRIES_LIBRARY else Distribution)
