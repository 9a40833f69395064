"""topk_select against a full sort, on both of its paths (Note [Top-k from a sampled
threshold] in commsched/compression_math.py): the candidates above a sampled threshold, and the
whole-tensor search when the sample misses where the large entries are."""

from __future__ import annotations

import pytest
import torch

from commsched.compression_math import _topk_among_candidates, topk_select

N = 300 * 300  # above the size from which the threshold is sampled


def _noise() -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(0))


def _large_between_samples() -> torch.Tensor:
    """Zeros with 2000 large entries at no multiple of the sample's stride: the sample sees
    only zeros, and few entries are nonzero."""
    values = torch.zeros(N)
    positions = torch.arange(N)
    positions = positions[positions % 97 != 0][:2000]
    values[positions] = torch.linspace(1.0, 5.0, 2000)
    return values


def _large_in_noise() -> torch.Tensor:
    """Small noise everywhere and 2000 large entries the sample does not see."""
    values = _noise() * 1e-3
    positions = torch.arange(N)
    values[positions[positions % 97 != 0][::40][:2000]] = -10.0
    return values


def _check(m: torch.Tensor, k: int) -> None:
    values, indices = topk_select(m.view(300, 300), k)
    assert indices.dtype is torch.int32 and indices.numel() == k
    assert bool((indices[1:] > indices[:-1]).all())  # ascending, no repeats
    torch.testing.assert_close(values, m[indices.long()], rtol=0, atol=0)
    # The same magnitudes as the k largest of a full sort (ties may pick other positions).
    want = m.abs().sort(descending=True).values[:k]
    torch.testing.assert_close(values.abs().sort(descending=True).values, want, rtol=0, atol=0)


@pytest.mark.parametrize("make,k,sampled", [
    (_noise, 900, True),  # 1%
    (_noise, 9000, True),  # 10%
    (_large_in_noise, 1500, True),  # the noise sets the threshold; the large ones pass it
    (_large_between_samples, 1500, True),  # threshold 0: the nonzero entries are candidates
    (_large_between_samples, 2500, False),  # fewer than k nonzero: the whole tensor
])
def test_topk_select_matches_a_full_sort(make, k: int, sampled: bool) -> None:
    m = make()
    assert (_topk_among_candidates(m.abs(), k) is not None) is sampled
    _check(m, k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_topk_select_in_other_dtypes(dtype: torch.dtype) -> None:
    m = _noise().to(dtype)
    assert _topk_among_candidates(m.abs(), 900) is not None
    _check(m, 900)


def test_fewer_than_k_above_a_positive_threshold_searches_everything() -> None:
    """Every sampled entry large, the rest small noise: the threshold is the sampled value,
    which only the sampled entries (928) reach: enough for k = 500, too few for k = 1500."""
    m = _noise() * 1e-3
    m[::97] = 5.0
    assert _topk_among_candidates(m.abs(), 500) is not None
    assert _topk_among_candidates(m.abs(), 1500) is None
    _check(m, 1500)


def test_nan_is_selected_as_torch_topk_ranks_it() -> None:
    m = _noise()
    m[12345] = float("nan")
    m[777] = float("inf")
    _values, indices = topk_select(m.view(300, 300), 900)
    picked = set(indices.tolist())
    assert {12345, 777} <= picked
    m[97 * 5] = float("nan")  # sampled: no threshold, the whole tensor is searched
    assert _topk_among_candidates(m.abs(), 900) is None
    _values, indices = topk_select(m.view(300, 300), 900)
    assert {12345, 777, 97 * 5} <= set(indices.tolist())
