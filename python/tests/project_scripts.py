# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The project's scripts (scripts/NAME.py) for their tests: the path to run them by and the module
to call them by."""
import importlib.util
import os

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")


def script_path(name):
    """scripts/NAME.py."""
    return os.path.join(SCRIPTS, name + ".py")


def load_script(name):
    """scripts/NAME.py imported as a module named NAME (its main() is not run)."""
    spec = importlib.util.spec_from_file_location(name, script_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
