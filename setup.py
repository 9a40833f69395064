"""Builds only the C++ extension commsched._C, against the torch of the environment that runs the
build; metadata lives in setup.cfg.

The extension links against libtorch's C++ symbols, so it runs only with the torch it was compiled
against. Hence (docs/install.md):

* install with ``pip install --no-build-isolation .``: pip's build isolation builds in a fresh
  environment that has no torch (pyproject.toml does not list it), and this file then refuses with
  one message saying so, rather than compiling against whatever torch an isolated build would
  download;
* the torch version it compiled against is written next to the extension, to
  ``commsched/_build_info.json``, which ``commsched.info.check_extension`` compares with the torch
  that imports it;
* objects are kept per torch version in ``build/temp-torch<version>-<python>``, shared by the
  editable install and wheel builds of this tree, so that ninja recompiles only what changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as setuptools_build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.cpp")))
HEADERS = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.h")))
BUILD_INFO = "_build_info.json"
# -std is left out: BuildExtension picks the one the installed torch needs (C++17 for 2.13, C++20
# for 2.14).
COMPILE_ARGS = ["-O2", "-Wall", "-Wno-unused-function"]

NO_TORCH = """
commsched: torch is not importable in the environment that builds commsched._C.
The extension must be compiled against the torch it will run with. pip's build isolation builds
in a fresh environment without your torch; install a supported torch ({range}) first, then:
    pip install --no-build-isolation .
(or `pip wheel --no-build-isolation --no-deps .`; see docs/install.md)
"""


def _torch_compat() -> Any:
    """commsched/torch_compat.py loaded by path: the package cannot be imported before it is
    built, and the supported range is kept in that file alone."""
    spec = importlib.util.spec_from_file_location(
        "_commsched_torch_compat", os.path.join(HERE, "commsched", "torch_compat.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_info(torch: Any, version: str) -> dict[str, Any]:
    return {
        "commsched": version,
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": platform.python_version(),
    }


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    """Serialises builds sharing one object directory (an editable install and a test's wheel
    build may run at once): two ninja runs in one directory corrupt its log and objects."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _replace_file(src: str, dst: str) -> None:
    """Copies by rename: a running process that has the old extension mapped keeps its inode;
    overwriting the file in place (what setuptools does) can kill it with SIGBUS."""
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _make_build_ext(torch: Any) -> type:
    from torch.utils.cpp_extension import BuildExtension

    base = BuildExtension.with_options(use_ninja=True)

    class BuildExt(base):  # type: ignore[misc, valid-type]
        """BuildExtension with a shared per-torch object directory and a build-info file."""

        def finalize_options(self) -> None:
            super().finalize_options()
            tag = re.sub(r"[^A-Za-z0-9_.-]", "-", torch.__version__)
            python = f"cp{sys.version_info.major}{sys.version_info.minor}"
            # setuptools' editable install builds in a fresh temporary directory each time, so
            # every `pip install -e .` recompiled everything; a fixed one lets ninja skip
            # unchanged objects (it tracks headers through depfiles).
            self.build_temp = os.path.join(HERE, "build", f"temp-torch{tag}-{python}")

        def build_extensions(self) -> None:
            with _locked(self.build_temp):
                super().build_extensions()
            info = _build_info(torch, self.distribution.get_version())
            for ext in self.extensions:
                path = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), BUILD_INFO)
                with open(path, "w", encoding="utf-8") as handle:
                    json.dump(info, handle, indent=1)
                    handle.write("\n")

        def copy_extensions_to_source(self) -> None:
            build_py = self.get_finalized_command("build_py")
            for ext in self.extensions:
                inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
                _replace_file(regular_file, inplace_file)
                _replace_file(os.path.join(os.path.dirname(regular_file), BUILD_INFO),
                              os.path.join(os.path.dirname(inplace_file), BUILD_INFO))

        def get_outputs(self) -> list[str]:
            outputs = list(super().get_outputs())
            if not self.inplace:
                outputs += [os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)),
                                         BUILD_INFO) for ext in self.extensions]
            return outputs

    return BuildExt


class RefuseBuild(setuptools_build_ext):
    """Stands in for the extension's build when torch is missing: metadata (egg_info, dist_info,
    sdist) still works, a build stops with one message."""

    def run(self) -> None:
        sys.exit(NO_TORCH.format(range=_supported_range_text()))


def _supported_range_text() -> str:
    with open(os.path.join(HERE, "commsched", "torch_compat.py"), encoding="utf-8") as handle:
        text = handle.read()
    low = re.search(r'^MIN_TORCH = "([^"]+)"', text, re.MULTILINE)
    high = re.search(r'^MAX_TESTED_TORCH = "([^"]+)"', text, re.MULTILINE)
    return f"{low.group(1) if low else '?'} to {high.group(1) if high else '?'}.x"


def _extension_and_command() -> tuple[Extension, type]:
    try:
        import torch
    except ImportError:
        return Extension("commsched._C", SOURCES, depends=HEADERS), RefuseBuild
    compat = _torch_compat()
    if compat.parse_version(torch.__version__)[:2] < compat.parse_version(compat.MIN_TORCH)[:2]:
        sys.exit(f"commsched: torch {torch.__version__} is older than the oldest supported, "
                 f"{compat.MIN_TORCH} (supported: {compat.supported_range()})")
    if not compat.is_supported(torch.__version__):
        warnings.warn(f"commsched: torch {torch.__version__} is newer than the newest tested "
                      f"({compat.supported_range()}); building anyway", stacklevel=1)
    from torch.utils.cpp_extension import CppExtension

    # The engine is written against c10's device-generic stream/event interfaces, so one set of
    # sources serves CPU and CUDA builds of torch alike; no .cu file is needed.
    extension = CppExtension("commsched._C", SOURCES, depends=HEADERS,
                             extra_compile_args=COMPILE_ARGS)
    return extension, _make_build_ext(torch)


EXTENSION, BUILD_EXT = _extension_and_command()
setup(ext_modules=[EXTENSION], cmdclass={"build_ext": BUILD_EXT})
