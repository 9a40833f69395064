"""commsched installed the way a PyTorch extension is (docs/install.md): a wheel built with
``pip wheel --no-build-isolation --no-deps .`` against the suite's torch, installed into a fresh
virtual environment that holds that torch but no Horovod, trains under torchrun there; and
scripts/install_horovod.sh installs Horovod into such an environment from its per-torch cache.

The environments reuse the suite's packages by symlink (torch, its requirements, commsched's),
so pip finds them installed and installs nothing but the wheel under test. The wheel is built in
the source tree, where setup.py keeps compiled objects per torch version (build/temp-torch*): the
editable install of scripts/setup.sh has compiled them already, and the wheel only relinks.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from launch import run_command
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.launcher

REPO = Path(__file__).resolve().parents[2]
# What the fresh environments reuse: pip to install with, torch and what commsched requires, and
# Horovod's own requirements (so that installing Horovod from its cache needs no index).
REUSED = ("pip", "torch", "numpy", "pyyaml", "cloudpickle", "psutil", "cffi", "packaging")

TRAIN = textwrap.dedent('''
    import json, os, sys
    import torch
    import commsched

    torch.set_num_threads(1)
    commsched.init()
    rank, size = commsched.rank(), commsched.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = commsched.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    commsched.broadcast_parameters(model.state_dict(), root_rank=0)
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(7))
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(100 + rank))  # its own data
    y = x @ target
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(size)]
    torch.distributed.all_gather(every, flat)
    spread = max(float((other - flat).abs().max()) for other in every)
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as handle:
        json.dump({"size": size, "losses": losses, "spread": spread,
                   "commsched": commsched.__file__}, handle)
    commsched.shutdown()
''')


def _run(args: list[str], timeout: float, cwd: Path, env: dict[str, str] | None = None,
         ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs a command outside the source tree (cwd, no PYTHONPATH) so that `import commsched`
    finds the installed package; kills its whole process group on timeout."""
    # Not a PYTHONPYCACHEPREFIX either (a developer's shell may set one): under it, the fresh
    # environment's torch, at a path of its own, would be compiled again instead of read from
    # the byte code its install wrote, as a user's environment reads it.
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "PYTHONPYCACHEPREFIX")
                and not k.startswith("COMMSCHED_")}
    full_env.update({"OMP_NUM_THREADS": "1", **(env or {})})
    return run_command(args, timeout, str(cwd), full_env, ok)


def _closure(names: Iterable[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` need at run time, their requirements included
    (extras and requirements whose markers do not hold are left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    queue = [canonicalize_name(n) for n in names]
    while queue:
        name = queue.pop()
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                queue.append(canonicalize_name(requirement.name))
    return list(found.values())


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def make_env(root: Path, reused: Iterable[str] = REUSED) -> Path:
    """A fresh virtual environment whose site-packages links to `reused` and their requirements
    in the suite's environment; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    target = _site_packages(python)
    for dist in _closure(reused):
        source = Path(str(dist.locate_file("")))
        # Not __pycache__: a shared one would take the new environment's byte code.
        entries = {Path(str(f)).parts[0] for f in dist.files or ()
                   if not str(f).startswith("..")} - {"__pycache__"}
        for entry in entries:
            if not (target / entry).exists() and (source / entry).exists():
                (target / entry).symlink_to(source / entry)
    return python


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools never empties build/lib*: a module deleted from the tree would still be packed.
    for stale in (REPO / "build").glob("lib.*"):
        shutil.rmtree(stale, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel",
          "--no-build-isolation", "--no-deps", "-w", str(out), str(REPO)], timeout=900,
         cwd=out, env={"MAX_JOBS": str(os.cpu_count() or 1)})
    (built,) = out.glob("commsched-*.whl")
    return built


def _install(python: Path, wheel: Path, cwd: Path) -> None:
    # --no-index: every requirement must already be there (the symlinked torch among them).
    _run([str(python), "-m", "pip", "--disable-pip-version-check", "install", "--no-index",
          "--no-build-isolation", str(wheel)], timeout=300, cwd=cwd)


def test_wheel_trains_under_torchrun_in_an_environment_without_horovod(wheel: Path,
                                                                       tmp_path: Path) -> None:
    python = make_env(tmp_path / "env")
    _install(python, wheel, tmp_path)
    site = _site_packages(python)
    assert not (site / "commsched").is_symlink()

    no_horovod = _run([str(python), "-c", "import horovod"], timeout=60, cwd=tmp_path, ok=False)
    assert no_horovod.returncode != 0 and "No module named 'horovod'" in no_horovod.stdout

    info = _run([str(python), "-m", "commsched", "info"], timeout=120, cwd=tmp_path)
    assert f"commsched: 0.1.0 ({site / 'commsched'})" in info.stdout, info.stdout
    assert f"commsched._C: built against torch {torch.__version__} (this torch)" in info.stdout
    assert re.search(r"^Horovod: not installed .*scripts/install_horovod\.sh", info.stdout,
                     re.MULTILINE), info.stdout
    assert "Gloo yes" in info.stdout

    # horovodrun is not there, so a process that claims to be its worker is told what to install.
    claimed = _run([str(python), "-c", "import commsched; commsched.init()"], timeout=120,
                   cwd=tmp_path, env={"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, ok=False)
    assert claimed.returncode != 0
    assert ("HorovodMissingError: commsched: this process was started by horovodrun "
            "(HOROVOD_RANK is set) but horovod is not importable") in claimed.stdout
    assert "scripts/install_horovod.sh" in claimed.stdout

    script = tmp_path / "train.py"
    script.write_text(TRAIN, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    _run([str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          str(script), str(out)], timeout=240, cwd=tmp_path)
    results = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    for result in results:
        assert result["size"] == 2
        assert result["commsched"].startswith(str(site)), result["commsched"]
        assert result["spread"] == 0.0, "parameters differ between the ranks"
        assert result["losses"][-1] < 0.2 * result["losses"][0], result["losses"]


def test_install_horovod_script_installs_the_cached_wheel_for_this_torch(wheel: Path,
                                                                         tmp_path: Path) -> None:
    """scripts/setup.sh installed Horovod through scripts/install_horovod.sh, which keeps the
    wheel it built per torch version; installing into another environment with the same torch
    reuses it (--cached-only: this test never compiles Horovod)."""
    python = make_env(tmp_path / "env")
    _install(python, wheel, tmp_path)
    script = str(REPO / "scripts" / "install_horovod.sh")
    result = _run([script, "--cached-only", str(python)], timeout=300, cwd=tmp_path, ok=False)
    if result.returncode == 3:
        pytest.skip("no Horovod wheel for this torch in the cache (Horovod in .venv was not "
                    "installed by scripts/install_horovod.sh): " + result.stdout.strip())
    assert result.returncode == 0, result.stdout
    assert f"installed for torch {torch.__version__}" in result.stdout
    again = _run([script, "--cached-only", str(python)], timeout=120, cwd=tmp_path)
    assert "already works" in again.stdout

    check = _run([str(python.parent / "horovodrun"), "--check-build"], timeout=120, cwd=tmp_path)
    assert re.search(r"\[X\] PyTorch", check.stdout) and re.search(r"\[X\] Gloo", check.stdout), \
        check.stdout
    info = _run([str(python), "-m", "commsched", "info"], timeout=120, cwd=tmp_path)
    assert f"Horovod: 0.28.1 (built against torch {torch.__version__})" in info.stdout, info.stdout
    assert "horovod.torch imports; built with Gloo" in info.stdout


def test_a_build_that_cannot_see_torch_is_refused_with_the_command_to_use(tmp_path: Path) -> None:
    """What pip's build isolation amounts to (pyproject.toml lists no torch): a build environment
    without torch. setup.py stops before compiling, saying what to run instead."""
    python = make_env(tmp_path / "env", reused=("pip", "setuptools", "wheel"))
    assert _run([str(python), "-c", "import torch"], timeout=60, cwd=tmp_path,
                ok=False).returncode != 0
    result = _run([str(python), "-m", "pip", "--disable-pip-version-check", "wheel",
                   "--no-build-isolation", "--no-deps", "--no-index", "-w", str(tmp_path / "out"),
                   str(REPO)], timeout=300, cwd=tmp_path, ok=False)
    assert result.returncode != 0
    assert "commsched: torch is not importable in the environment that builds commsched._C" \
        in result.stdout, result.stdout[-3000:]
    assert "pip install --no-build-isolation ." in result.stdout
    assert not list(tmp_path.glob("out/*.whl"))
