"""Dropout's random draws inside Triton kernels: 16-bit draws, eight from one Philox call.

`tl.rand` runs a whole Philox call (ten rounds of 32-bit multiplies) for every value it returns. In a kernel that
otherwise only loads, adds and stores, that arithmetic costs: it took most of the stacked encoder's attention
kernels' time (`packed.attention_kernels`), and 25 of the 75 us of inductor's compiled dropout + residual +
LayerNorm forward at the Conneau config (24,576 x 768 bf16, one H200, no autograd: `benchmarks/dropout_norm_speed.py`).
`tl.randint4x` returns four 32-bit words a call: as 16-bit halves, eight draws.

A value survives where its draw is >= round(p * 65536): the rate is rounded to a multiple of 1 / 65536 (0.1 becomes
0.100006), and the survivors are scaled by 65536 / (65536 - threshold), which keeps their expectation exact.
"""
import triton
import triton.language as tl

DRAW_VALUES = 2 ** 16


def draw_threshold(dropout):
    """(threshold on the 16-bit draws, the survivors' scale) of dropout rate `dropout`."""
    threshold = round(dropout * DRAW_VALUES)
    return threshold, DRAW_VALUES / (DRAW_VALUES - threshold)


@triton.jit
def keep_draws(seed, first, threshold, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(ROWS, COLS) bool, which values survive: row r's draws come from Philox counters first + r * COLS / 8 on,
    so a tile starting at row R of a tensor whose rows are COLS wide draws from first = R * COLS / 8 whatever the
    tile's height, and a kernel that draws again from the same seed gets the same mask."""
    row = tl.arange(0, ROWS)[:, None]
    eighth = tl.arange(0, COLS // 8)[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, first + row * (COLS // 8) + eighth)
    words = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (ROWS, COLS // 2))
    return tl.reshape(tl.join(words & 0xFFFF, (words >> 16) & 0xFFFF), (ROWS, COLS)) >= threshold
