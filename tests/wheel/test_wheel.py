# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The installable wheel, end to end: scripts/build-wheel.sh packs the plug-in the build tree
already has; the wheel must be cistern-alloc-cu<N> (or -sim without CUDA), tagged
py3-none-<platform>, with the library inside. It is then pip-installed (--no-index --no-deps)
into a fresh virtual environment, and `python -I` there, run from a folder outside the source
tree with no CISTERN_PLUGIN_LIBRARY or PYTHONPATH, imports cistern, allocates and frees on the
simulated device, and must have loaded the package and the library from site-packages.

Usage: test_wheel.py --source ROOT --plugin LIBRARY [--keep]
       test_wheel.py --skip REASON       prints the reason and exits 77 (ctest: skipped)
Exit 77 too when no Python here has setuptools, wheel, pip and venv (Debian: python3-setuptools,
python3-wheel, python3-pip, python3-venv)."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

SKIPPED = 77

# Runs inside the virtual environment: what was loaded from where, and one allocation.
CHILD = r"""
import json, sys, sysconfig
import cistern
from cistern import _library
lib = cistern.load()
p = lib.cistern_malloc(1000, 0, None)
allocated = cistern.memory_stats(0)["allocated_bytes.all.current"]
lib.cistern_free(p, 1000, 0, None)
after_free = cistern.memory_stats(0)["allocated_bytes.all.current"]
cistern.check(0)
cistern.empty_cache()
print(json.dumps({
    "prefix": sys.prefix, "site": sysconfig.get_paths()["platlib"],
    "package": cistern.__file__, "library": cistern.library_path(),
    "candidates": _library.candidates(), "backend": cistern.backend(),
    "version": cistern.version(), "pointer": p, "allocated": allocated,
    "after_free": after_free,
    "reserved": cistern.memory_stats(0)["reserved_bytes.all.current"],
    "misuse": cistern.misuse_count()}))
"""


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise Failure("%s exited %d:\n%s%s" % (" ".join(command), result.returncode,
                                               result.stdout, result.stderr))
    return result.stdout


def packaging_python():
    """The first interpreter that can build a wheel and make a virtual environment with pip."""
    probe = "import setuptools, wheel, pip, venv, ensurepip"
    for candidate in (sys.executable, "/usr/bin/python3"):
        if candidate and os.path.exists(candidate) and subprocess.run(
                [candidate, "-c", probe], capture_output=True).returncode == 0:
            return candidate
    return None


def needed_libraries(library):
    out = run(["readelf", "-d", library])
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out), out


def expected_variant(plugin):
    needed, _ = needed_libraries(plugin)
    for name in needed:
        match = re.fullmatch(r"libcudart\.so\.(\d+)", name)
        if match:
            return "cu" + match.group(1)
    return "sim"


def package_version(source):
    with open(os.path.join(source, "python", "cistern", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def build_wheel(python, source, plugin, dist):
    env = dict(os.environ, PYTHON=python)
    out = run([os.path.join(source, "scripts", "build-wheel.sh"), "--plugin", plugin, dist],
              env=env)
    wheel = out.strip().splitlines()[-1]
    check(os.path.isfile(wheel), "build-wheel.sh's last line is no wheel: %r" % wheel)
    return wheel


def check_wheel(wheel, python, variant, version, work):
    """The file name's tags, the metadata, and the library inside."""
    platform = run([python, "-c", "import sysconfig; print(sysconfig.get_platform())"]).strip()
    tag = "py3-none-" + re.sub(r"[-.]", "_", platform)
    name = "cistern_alloc_%s-%s-%s.whl" % (variant, version, tag)
    check(os.path.basename(wheel) == name, "the wheel is %s, not %s" % (wheel, name))
    info = "cistern_alloc_%s-%s.dist-info/" % (variant, version)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for member in ("cistern/__init__.py", "cistern/_library.py", "cistern/torch.py",
                       "cistern/_torch_glue.cpp", "cistern/libcistern_plugin.so",
                       info + "LICENSE", info + "NOTICE"):
            check(member in names, "the wheel lacks %s (it has %s)" % (member, sorted(names)))
        metadata = archive.read(info + "METADATA").decode()
        wheel_file = archive.read(info + "WHEEL").decode()
        archive.extract("cistern/libcistern_plugin.so", work)
    check(re.search(r"^Name: cistern-alloc-%s$" % variant, metadata, re.M),
          "METADATA names another distribution:\n" + metadata[:300])
    check(re.search(r"^Version: %s$" % re.escape(version), metadata, re.M),
          "METADATA's version is not " + version)
    check(re.search(r"^Tag: %s$" % tag, wheel_file, re.M), "WHEEL's tag is not %s:\n%s"
          % (tag, wheel_file))
    check("Root-Is-Purelib: false" in wheel_file, "WHEEL says the root is pure:\n" + wheel_file)
    needed, dynamic = needed_libraries(os.path.join(work, "cistern", "libcistern_plugin.so"))
    check("RUNPATH" not in dynamic and "RPATH" not in dynamic,
          "the wheel's library keeps a run path:\n" + dynamic)
    return needed


def install_and_use(python, wheel, source, work):
    venv = os.path.join(work, "venv")
    run([python, "-m", "venv", venv])
    venv_python = os.path.join(venv, "bin", "python")
    run([venv_python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
         "--disable-pip-version-check", "--quiet", wheel])
    elsewhere = os.path.join(work, "elsewhere")
    os.mkdir(elsewhere)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CISTERN_", "PYTHON")) and k != "VIRTUAL_ENV"}
    env.update(CISTERN_BACKEND="sim", CISTERN_SIM_CAPACITY="1GiB")
    # -I: no PYTHONPATH, no user site, and neither the script's folder nor the cwd on sys.path.
    out = run([venv_python, "-I", "-c", CHILD], cwd=elsewhere, env=env)
    seen = json.loads(out.strip().splitlines()[-1])
    site = os.path.realpath(seen["site"])
    real = {key: os.path.realpath(seen[key]) for key in ("prefix", "package", "library")}
    check(real["prefix"] == os.path.realpath(venv), "not the venv's python: %s" % seen)
    check(site.startswith(real["prefix"] + os.sep), "site-packages outside the venv: %s" % seen)
    for key in ("package", "library"):
        check(real[key].startswith(site + os.sep), "the %s came from %s, not from %s"
              % (key, seen[key], site))
        check(not real[key].startswith(os.path.realpath(source) + os.sep),
              "the %s came from the source tree: %s" % (key, seen[key]))
    # The package's own folder, then the loader's search: no build folder of a source tree.
    check(seen["candidates"] == [seen["library"], "libcistern_plugin.so"],
          "an installed package searches %s" % seen["candidates"])
    check(seen["backend"] == "sim", "backend %s, not sim" % seen["backend"])
    check(seen["pointer"] and seen["pointer"] % 512 == 0, "cistern_malloc gave %s" % seen)
    check(seen["allocated"] == 1024 and seen["after_free"] == 0 and seen["reserved"] == 0,
          "statistics: %s" % seen)
    check(seen["misuse"] == 0, "misuse recorded: %s" % seen)
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", help="the repository root")
    parser.add_argument("--plugin", help="the built libcistern_plugin.so")
    parser.add_argument("--skip", help="skip, saying why")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    if args.skip:
        print("python_wheel: skipped: " + args.skip)
        return SKIPPED
    python = packaging_python()
    if not python:
        print("python_wheel: skipped: no Python here has setuptools, wheel, pip and venv "
              "(apt-get install python3-setuptools python3-wheel python3-pip python3-venv)")
        return SKIPPED
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="cistern-wheel-")
    try:
        variant = expected_variant(args.plugin)
        version = package_version(args.source)
        wheel = build_wheel(python, args.source, args.plugin, os.path.join(work, "dist"))
        built = time.monotonic()
        needed = check_wheel(wheel, python, variant, version, work)
        seen = install_and_use(python, wheel, args.source, work)
        print("python_wheel: %s (%d KiB, needs %s), built with %s in %.1f s; installed in a venv "
              "and used from %s in %.1f s" % (
                  os.path.basename(wheel), os.path.getsize(wheel) // 1024, " ".join(needed),
                  python, built - start, seen["library"], time.monotonic() - built))
        return 0
    except Failure as failure:
        print("python_wheel: FAILED: %s" % failure)
        return 1
    finally:
        if args.keep:
            print("python_wheel: kept " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
