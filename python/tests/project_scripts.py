# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The project's scripts (scripts/NAME.py) for their tests: the path to run them by, the module
to call them by, and a stand-in for the `cistern` CLI they run."""
import importlib.util
import os
import stat
import sys

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


def write_stand_in(directory, body):
    """DIRECTORY/cistern, an executable Python program of `body` (run by this interpreter) that a
    script under test calls in place of the CLI; returns its path."""
    cli = os.path.join(directory, "cistern")
    with open(cli, "w", encoding="utf-8") as f:
        f.write(f"#!{sys.executable}\n" + body)
    os.chmod(cli, os.stat(cli).st_mode | stat.S_IXUSR)
    return cli
