"""Centred kernel alignment (Kornblith et al. 2019), linear kernel, computed in feature space.

Rows are samples (e.g. the same n parallel sentences under two models), columns features; the two inputs may have
different widths. Inputs are numpy arrays or torch tensors; the computation runs in float64 on the input's device.
"""
import torch


def _centred_float64(x):
    x = torch.as_tensor(x).to(torch.float64)
    return x - x.mean(dim=0, keepdim=True)


def _paired(x, y):
    x, y = _centred_float64(x), _centred_float64(y).to(torch.as_tensor(x).device)
    if len(x) != len(y):
        raise ValueError(f"CKA needs the same samples in both inputs, got {len(x)} and {len(y)} rows")
    return x, y


def linear_cka(x, y):
    """||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) on column-centred X, Y."""
    x, y = _paired(x, y)
    return (torch.linalg.matrix_norm(y.T @ x) ** 2
            / (torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y))).item()


def _unbiased_hsic(x, y):
    """Song et al. 2012's unbiased HSIC estimator for the linear kernels K = XX^T, L = YY^T (without the constant
    1/(n(n-3)), which cancels in CKA), from feature-space quantities only: K~ is K with a zeroed diagonal."""
    n = len(x)
    k_diag, l_diag = (x * x).sum(dim=1), (y * y).sum(dim=1)
    trace_kl = torch.linalg.matrix_norm(x.T @ y) ** 2 - (k_diag * l_diag).sum()   # tr(K~ L~)
    k_rowsum = x @ x.sum(dim=0) - k_diag                                            # K~ 1
    l_rowsum = y @ y.sum(dim=0) - l_diag                                            # L~ 1
    return (trace_kl + k_rowsum.sum() * l_rowsum.sum() / ((n - 1) * (n - 2))
            - 2 / (n - 2) * (k_rowsum @ l_rowsum))


def debiased_linear_cka(x, y):
    """Linear CKA with the unbiased HSIC estimator (Nguyen et al. 2021; Kornblith et al.'s `debiased=True`),
    which removes the bias of plain CKA towards 1 when samples are few relative to features."""
    x, y = _paired(x, y)
    if len(x) < 4:
        raise ValueError(f"debiased CKA needs at least 4 samples, got {len(x)}")
    return (_unbiased_hsic(x, y) / torch.sqrt(_unbiased_hsic(x, x) * _unbiased_hsic(y, y))).item()
