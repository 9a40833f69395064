"""commsched.torch_compat: the supported torch range and the helpers that bridge versions, checked
against the torch that runs the suite (scripts/check_torch_compat.sh runs it on the oldest)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from commsched import torch_compat
from commsched.torch_compat import is_supported, parse_version


@pytest.mark.parametrize(("text", "parsed"), [
    ("2.13.0+cpu", (2, 13, 0)), ("2.4.1+cu121", (2, 4, 1)), ("2.15.0a0+git1234", (2, 15, 0)),
    ("2.4", (2, 4, 0)), ("2.10.0rc3", (2, 10, 0)), ("3.0.1", (3, 0, 1))])
def test_parse_version_ignores_local_and_pre_release_suffixes(text: str,
                                                            parsed: tuple[int, int, int]) -> None:
    assert parse_version(text) == parsed


def test_parse_version_rejects_what_is_no_version() -> None:
    with pytest.raises(ValueError, match="not a torch version"):
        parse_version("nightly")


@pytest.mark.parametrize("version",
                         ["2.4.0", "2.4.1+cu121", "2.13.0+cpu", "2.15.0", "2.15.9+cu130"])
def test_range_takes_every_patch_release_from_min_to_max(version: str) -> None:
    assert is_supported(version)


@pytest.mark.parametrize("version", ["2.3.1", "1.13.1", "2.16.0", "3.0.0"])
def test_range_refuses_older_and_untested_newer(version: str) -> None:
    assert not is_supported(version)


def test_the_torch_running_the_suite_is_in_range() -> None:
    assert is_supported(torch.__version__), torch.__version__
    assert torch_compat.supported_range() == "2.4 to 2.15.x"


def test_ddp_kwargs_name_an_argument_this_torch_takes_without_a_deprecation_warning() -> None:
    kwargs = torch_compat.ddp_kwargs(sync_buffers=False)
    params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    assert set(kwargs) <= set(params) and list(kwargs.values()) == [False]
    if "forward_sync_buffers" in params:  # 2.13 on: the old name warns
        assert kwargs == {"forward_sync_buffers": False}


def test_at_least_compares_major_and_minor() -> None:
    major, minor, _ = torch_compat.TORCH_VERSION
    assert torch_compat.at_least(major, minor) and torch_compat.at_least(2, 4)
    assert not torch_compat.at_least(major, minor + 1) and not torch_compat.at_least(major + 1, 0)
