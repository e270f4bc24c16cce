"""Where work runs: the GPU when there is one. torch is imported on first use, so that commands which only parse
arguments or print a plan start without it."""


def has_gpu():
    import torch

    return torch.cuda.is_available()


def default_device():
    """"cuda" when there is a GPU, else "cpu"."""
    return "cuda" if has_gpu() else "cpu"
