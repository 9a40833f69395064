"""``python -m commsched info``: what this installation is made of.

In the spirit of ``horovodrun --check-build``: versions of commsched, torch and Horovod, the
torch that ``commsched._C`` was compiled against, the torch.distributed backends, CUDA, and
every knob in effect with where its value came from.

It also holds `check_extension`, which imports ``commsched._C`` and turns a wrong build (compiled
against another torch, an undefined symbol) into one error that names both torch versions and the
fix. setup.py writes the version it compiled against to ``_build_info.json`` beside the extension.

At the top layer with __main__; it imports nothing of commsched at module level, so that the
package's __init__ can run `check_extension` before anything else loads the extension.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

BUILD_INFO_FILE = "_build_info.json"
REBUILD = ("rebuild it against this torch: `pip install --no-build-isolation --force-reinstall "
           ".` in commsched's source tree (the project's .venv: scripts/setup.sh), see "
           "docs/install.md")


class ExtensionBuildError(ImportError):
    """commsched._C cannot run with this process's torch.

    It was compiled against another torch, or cannot be loaded at all (an undefined symbol, not
    built). ``import commsched`` raises it; the message names both torch versions and how to
    rebuild.
    """


def build_info(package_dir: str | None = None) -> dict[str, Any] | None:
    """What setup.py recorded when it compiled commsched._C (torch version, CUDA, Python).

    Args:
        package_dir: the commsched package folder; None: this module's.

    Returns:
        The recorded fields, or None where the file is missing (built by a setup.py that did not
        write it) or unreadable.
    """
    folder = package_dir or os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(folder, BUILD_INFO_FILE), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_extension(module: str = "commsched._C",
                    info: Mapping[str, Any] | None = None) -> ModuleType:
    """Imports the C++ extension after checking that it was built against the running torch.

    Args:
        module: the extension's import name (tests load a deliberately broken one).
        info: the build record to check against; None reads the package's `build_info()`.

    Returns:
        The imported extension module.

    Raises:
        ExtensionBuildError: the record names another torch than the running one (the extension
            is then not loaded at all: a C++ ABI mismatch can crash rather than fail), or loading
            it raised ImportError. The message names both versions and how to rebuild.
    """
    import torch

    recorded = build_info() if info is None else info
    built = str(recorded["torch"]) if recorded and "torch" in recorded else None
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        spec = None
    where = f" ({spec.origin})" if spec is not None and spec.origin else ""
    if built is not None and built != torch.__version__:
        raise ExtensionBuildError(
            f"commsched: the extension {module}{where} was built against torch {built}, but this "
            f"process runs torch {torch.__version__} (from {os.path.dirname(torch.__file__)}); "
            + REBUILD)
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if isinstance(err, ExtensionBuildError):
            raise
        if spec is None:
            what = "is not built"
        elif "undefined symbol" in str(err):
            what = "does not match this torch (an undefined symbol)"
        else:
            what = "cannot be loaded"
        raise ExtensionBuildError(
            f"commsched: the extension {module}{where} {what}: it was built against torch "
            f"{built or 'unknown (no build record)'}, this process runs torch "
            f"{torch.__version__}; {REBUILD}. The import said: {err}") from err


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _horovod_lines() -> tuple[list[str], bool]:
    """Horovod's part of the report, and whether it is sound.

    Absent counts as sound: Horovod is an optional extra.
    """
    from .world.errors import HOROVOD_INSTALL

    spec = importlib.util.find_spec("horovod")
    version = _version("horovod")
    if spec is None:
        return [f"Horovod: not installed (needed only for horovodrun jobs and the `hvd` "
                f"benchmark baseline; {HOROVOD_INSTALL})"], True
    built_for = None
    for folder in spec.submodule_search_locations or ():
        try:
            with open(os.path.join(folder, "metadata.json"), encoding="utf-8") as handle:
                built_for = json.load(handle).get("pytorch")
        except (OSError, ValueError):
            continue
    import torch

    head = f"Horovod: {version or 'unknown version'} (built against torch {built_for or '?'})"
    if built_for != torch.__version__:
        # Horovod only warns about this when its extension still loads; it may then crash.
        return [head, f"  not this torch ({torch.__version__}): {HOROVOD_INSTALL}"], False
    try:
        hvd = importlib.import_module("horovod.torch")
    except Exception as err:  # any failure to load is what this line reports
        return [head, f"  horovod.torch cannot be imported: {err}", f"  {HOROVOD_INSTALL}"], False
    parts = [name for name, built in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built()),
                                      ("NCCL", hvd.nccl_built())) if built]
    return [head, "  horovod.torch imports; built with " + (", ".join(parts) or "none of "
                                                            "Gloo, MPI, NCCL")], True


def _platform_lines() -> list[str]:
    import torch
    import torch.distributed as dist

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    lines = [f"torch.distributed: {yes(dist.is_available())}"]
    if dist.is_available():
        lines.append(f"  backends: Gloo {yes(dist.is_gloo_available())}, "
                     f"NCCL {yes(dist.is_nccl_available())}, MPI {yes(dist.is_mpi_available())}")
    if torch.version.cuda is None:
        lines.append("CUDA: no (a CPU build of torch)")
    else:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
        lines.append(f"CUDA: {torch.version.cuda} (built), available {yes(available)}, "
                     f"{count} device(s)")
    return lines


def _source_text(resolved: Any) -> str:
    from .config import Source

    if resolved.source is Source.HOROVOD_TWIN:
        return resolved.where + " (Horovod's twin)"
    if resolved.source in (Source.ENVIRONMENT, Source.YAML):
        return resolved.where
    if resolved.source is Source.ARGUMENT:
        return "keyword argument"
    return "default (a fifth of timeout)" if resolved.key == "stall_warning" else "default"


def _knob_lines(environ: Mapping[str, str]) -> list[str]:
    from .config import CONFIG_ENV, ENV_PREFIX, knob_sources

    sources = knob_sources(environ=environ)
    width = max(len(key) for key in sources)
    value_width = max(len(_shown(s.value)) for s in sources.values())
    lines = [f"Knobs in effect (keyword arguments of DistributedOptimizer: n/a here; then "
             f"{ENV_PREFIX}*, the YAML file in {CONFIG_ENV}, Horovod's twin variables, "
             f"defaults):"]
    for key, resolved in sources.items():
        lines.append(f"  {key:<{width}}  {_shown(resolved.value):<{value_width}}  "
                     f"{_source_text(resolved)}")
    return lines


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, str) and not value:
        return '""'
    return str(getattr(value, "value", value))


def report(environ: Mapping[str, str] | None = None) -> tuple[list[str], int]:
    """The report's lines and the exit status it calls for, once the extension has loaded.

    Args:
        environ: the environment whose knobs are reported; None reads os.environ.

    Returns:
        (lines, status): status 0 when everything installed works, 1 when something is broken
        (Horovod installed but not importable, a bad knob).

    Raises:
        ExtensionBuildError: what `check_extension` raises.
    """
    import torch

    from .config import ConfigError

    env = os.environ if environ is None else environ
    check_extension()
    package = os.path.dirname(os.path.abspath(__file__))
    recorded = build_info()
    lines = [f"commsched: {_version('commsched') or 'unknown version'} ({package})",
             f"torch: {torch.__version__} ({os.path.dirname(torch.__file__)})"]
    if recorded is None:
        lines.append("commsched._C: loads; the torch it was built against is unknown (no "
                     f"{BUILD_INFO_FILE}: an older setup.py built it; reinstall to record it)")
    else:
        lines.append(f"commsched._C: built against torch {recorded.get('torch')} (this torch), "
                     f"Python {recorded.get('python')}")
    horovod, horovod_ok = _horovod_lines()
    lines += horovod
    status = 0 if horovod_ok else 1
    lines += _platform_lines()
    try:
        lines += _knob_lines(env)
    except ConfigError as err:
        lines.append(f"Knobs: {err}")
        status = 1
    return lines, status


def main(argv: list[str]) -> int:
    """`python -m commsched info`: prints the report.

    Args:
        argv: the arguments after ``info`` (only --help is known).

    Returns:
        The exit status: 0 when everything installed works, 1 when something is broken or a
        knob is set wrong (the extension's error alone is printed when it does not load, to
        stderr), 2 for bad usage.
    """
    if argv:
        known = argv[0] in ("-h", "--help")
        print("usage: python -m commsched info\n  versions, the torch the extension was built "
              "against, Horovod, backends, CUDA, and the knobs in effect with their sources",
              file=sys.stdout if known else sys.stderr)
        return 0 if known else 2
    try:
        lines, status = report()
    except ExtensionBuildError as err:
        print(err, file=sys.stderr)
        return 1
    print("\n".join(lines))
    if status:
        print("commsched info: a check failed (see above): Horovod is installed but does not "
              "import, or a knob is set wrong", file=sys.stderr)
    return status
