"""Kronecker factors and the preconditioned gradient of one layer (docs/kfac.md has the formulas).

For a layer with weight W (out x in) and optional bias, the gradient is seen as one matrix
M = [dW | db] of shape out x (in + 1). K-FAC approximates the layer's Fisher block by A (x) G with
    A = a^T a / R,   a: the layer inputs as R rows (Conv2d: unfolded patches), a ones column
                     appended when there is a bias;
    G = (N g)^T (N g) / N,   g: the gradient of the loss w.r.t. the layer output as R rows, N the
                     batch size (the loss is a mean over the batch, so N g is per example).
A averages over positions and G sums over them, so that A (x) G has the scale of the Fisher
block (Grosse & Martens' KFC for convolutions); for a Linear on 2-D input R = N.
Averaging A and G over ranks with equal local batches gives the factors of the whole batch.
"""

from __future__ import annotations

import enum
import functools

import torch
from torch import nn
from torch.nn import functional


class ComputeMethod(enum.StrEnum):
    EIGEN = "eigen"
    INVERSE = "inverse"


def supported(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros" \
            and not isinstance(module.padding, str)
    return False


def weight_of(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def bias_of(module: nn.Module) -> torch.Tensor | None:
    bias = module.bias
    return bias if isinstance(bias, torch.Tensor) else None


def _with_ones(rows: torch.Tensor, bias: bool) -> torch.Tensor:
    if not bias:
        return rows
    return torch.cat([rows, rows.new_ones(rows.shape[0], 1)], dim=1)


def input_rows(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Conv2d):
        assert not isinstance(module.padding, str)  # supported() excludes 'same' / 'valid'
        x = _batched(module, x)
        patches = functional.unfold(x, module.kernel_size, dilation=module.dilation,
                                    padding=module.padding, stride=module.stride)
        rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    else:
        rows = x.reshape(-1, x.shape[-1])
    return _with_ones(rows, bias_of(module) is not None)


def _batched(module: nn.Module, tensor: torch.Tensor) -> torch.Tensor:
    """The leading dimension is the batch (batch-first layouts); an unbatched input is one
    example."""
    unbatched = tensor.dim() == (3 if isinstance(module, nn.Conv2d) else 1)
    return tensor.unsqueeze(0) if unbatched else tensor


def output_grad_rows(module: nn.Module, grad: torch.Tensor) -> torch.Tensor:
    grad = _batched(module, grad)
    if isinstance(module, nn.Conv2d):
        rows = grad.transpose(1, -1).reshape(-1, grad.shape[1])
    else:
        rows = grad.reshape(-1, grad.shape[-1])
    return rows * grad.shape[0]


def covariance(rows: torch.Tensor, count: int) -> torch.Tensor:
    return rows.t() @ rows / count


def a_factor(module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """None for an empty batch (there is nothing to average)."""
    rows = input_rows(module, x.detach())
    return covariance(rows, rows.shape[0]) if rows.shape[0] else None


def g_factor(module: nn.Module, grad: torch.Tensor) -> torch.Tensor | None:
    batch = _batched(module, grad).shape[0]
    return covariance(output_grad_rows(module, grad.detach()), batch) if batch else None


def a_dim(module: nn.Module) -> int:
    return weight_of(module)[0].numel() + (1 if bias_of(module) is not None else 0)


def g_dim(module: nn.Module) -> int:
    return weight_of(module).shape[0]


def gradient_matrix(module: nn.Module) -> torch.Tensor | None:
    weight = weight_of(module)
    if weight.grad is None:
        return None
    matrix = weight.grad.reshape(weight.shape[0], -1)
    bias = bias_of(module)
    if bias is not None:
        bias_grad = bias.grad if bias.grad is not None else torch.zeros_like(bias)
        matrix = torch.cat([matrix, bias_grad.reshape(-1, 1)], dim=1)
    return matrix


def write_gradient(module: nn.Module, matrix: torch.Tensor) -> None:
    weight = weight_of(module)
    assert weight.grad is not None
    columns = weight[0].numel()
    weight.grad.copy_(matrix[:, :columns].reshape(weight.shape))
    bias = bias_of(module)
    if bias is not None and bias.grad is not None:
        bias.grad.copy_(matrix[:, columns].reshape(bias.shape))


# --- symmetric packing: only the upper triangle of a symmetric matrix travels ---------------------

def upper_numel(dim: int) -> int:
    return dim * (dim + 1) // 2


@functools.lru_cache(maxsize=256)
def _upper_indices(dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = torch.triu_indices(dim, dim, device=device)
    return rows, cols


def pack_upper(matrix: torch.Tensor) -> torch.Tensor:
    rows, cols = _upper_indices(matrix.shape[0], matrix.device)
    return matrix[rows, cols]


def unpack_upper(values: torch.Tensor, dim: int) -> torch.Tensor:
    rows, cols = _upper_indices(dim, values.device)
    matrix = values.new_zeros(dim, dim)
    matrix[rows, cols] = values
    matrix[cols, rows] = values
    return matrix


# --- decompositions and preconditioning -----------------------------------------------------------

def eigen(factor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvectors and eigenvalues; factors are positive semi-definite, so the negative
    eigenvalues eigh returns are rounding error and are clamped at zero."""
    values, vectors = torch.linalg.eigh(factor)
    return vectors.contiguous(), values.clamp(min=0.0)


def damped_inverse(factor: torch.Tensor, damping: float) -> torch.Tensor:
    """(F + sqrt(damping) I)^-1: the damping split evenly over the two factors."""
    eye = torch.eye(factor.shape[0], dtype=factor.dtype, device=factor.device)
    return torch.linalg.inv(factor + damping ** 0.5 * eye)


def precondition_eigen(grad: torch.Tensor, qa: torch.Tensor, da: torch.Tensor, qg: torch.Tensor,
                       dg: torch.Tensor, damping: float) -> torch.Tensor:
    """(G (x) A + damping I)^-1 vec(M), through the eigenbases of A and G."""
    rotated = qg.t() @ grad @ qa
    return qg @ (rotated / (dg.unsqueeze(1) * da.unsqueeze(0) + damping)) @ qa.t()


def precondition_inverse(grad: torch.Tensor, a_inv: torch.Tensor,
                         g_inv: torch.Tensor) -> torch.Tensor:
    return g_inv @ grad @ a_inv
