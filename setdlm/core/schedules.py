"""Noise schedules: the linear schedule of MDLM/BD3LM and the staggered schedule of SetDLM.

Both are frozen dataclasses whose fields are stored in model configs, so a checkpoint always
carries its exact schedule (never re-derived from a model name, SPEC 1.2 "schedule-version
trap"). Time runs from t = 0 (clean) to t = 1 (fully masked); ``alpha(t)`` is the probability
that a token is still clean at time t.

Randomness only ever comes from an explicit ``torch.Generator``. Where the official code draws
from the global RNG, we draw the same distribution with the same op, shape and dtype, so a
generator seeded with s reproduces the official draw made after ``torch.manual_seed(s)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["LinearSchedule", "StaggeredSchedule", "sample_t"]


def _float_tensor(t: torch.Tensor | float, default_dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a floating tensor; Python numbers and integer tensors get ``default_dtype``."""
    t = torch.as_tensor(t)
    return t if t.is_floating_point() else t.to(default_dtype)


@dataclass(frozen=True)
class LinearSchedule:
    """Linear masking schedule, ``alpha(t) = 1 - t`` (the official ``LinearNoise``).

    Plain (``block_size`` and ``length`` both None) is what MDLM and BD3LM train and evaluate
    with; BD3LM gets its per-block behaviour from a per-block t (see ``sample_t``), not from
    this class. The blocked variant (both set) gives every block of ``block_size`` positions
    its own time window ``[-loc, -loc + 1/num_blocks]``; the first block is revealed first.

    eps: smallest training time, the collator's ``sampling_eps``; t ~ U[eps, 1] keeps the
    1/t NELBO weight bounded. Pass it to ``sample_t``.

    Computations are float32, as in the official code (its values in the parity fixtures are
    float32 roundings).
    """

    block_size: int | None = None
    length: int | None = None
    eps: float = 1e-3

    def __post_init__(self) -> None:
        if (self.block_size is None) != (self.length is None):
            raise ValueError("LinearSchedule needs both block_size and length, or neither")
        if self.blocked and not (0 < self.block_size <= self.length):
            raise ValueError(f"need 0 < block_size <= length, got {self.block_size}, {self.length}")
        if self.blocked and self.length % self.block_size != 0:
            raise ValueError(f"length {self.length} is not a multiple of block {self.block_size}")
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {self.eps}")

    @property
    def blocked(self) -> bool:
        return self.block_size is not None

    @property
    def num_blocks(self) -> int:
        return self.length // self.block_size if self.blocked else 1

    @property
    def b(self) -> float:
        """Width of each position's time window."""
        return 1.0 / self.num_blocks

    def loc(self) -> torch.Tensor:
        """Per-position offsets, ``(length,)`` float32 (blocked) or ``(1,)`` zeros (plain).

        Blocked: block i (of n) gets loc = -(n - 1 - i)/n, so it is masked while t is in
        ``[(n - 1 - i)/n, (n - i)/n]``: the last block first in forward time, i.e. the first
        block is revealed first in reverse time.
        """
        if not self.blocked:
            return torch.zeros(1)
        n = self.num_blocks
        starts = torch.linspace(0.0, 1.0 - 1.0 / n, n)  # (n,) float32, block window starts
        return -starts.repeat_interleave(self.block_size).flip(0)  # (length,)

    def alpha(self, t: torch.Tensor | float) -> torch.Tensor:
        """Clean probability. Plain: same shape as t. Blocked: t broadcast against (length,)."""
        t = _float_tensor(t, torch.float32).to(torch.float32)
        if not self.blocked:
            return 1 - t.clamp(0.0, 1.0)
        move_chance = ((t + self.loc()) * self.num_blocks).clamp(0.0, 1.0)
        return 1 - move_chance

    def alpha_prime(self, t: torch.Tensor | float) -> torch.Tensor:
        """d alpha / dt, shaped like ``alpha(t)``.

        Plain: -1 everywhere. Blocked: reproduces the official rule, which is -num_blocks only
        where ``loc < t < loc + 1/num_blocks``. Since loc <= 0 this is nonzero only for the last
        block while t < 1/num_blocks, not on each block's active window; the parity fixtures pin
        this, and no training or evaluation path uses the blocked rate.
        """
        t = _float_tensor(t, torch.float32).to(torch.float32)
        if not self.blocked:
            return -torch.ones_like(t)
        loc = self.loc()  # (length,)
        inside = (t > loc) & (t < loc + 1.0 / self.num_blocks)
        return torch.where(inside, -float(self.num_blocks), 0.0)

    def loss_weight(self, t: torch.Tensor | float) -> torch.Tensor:
        """NELBO weight ``-alpha'(t) / (1 - alpha(t))``; 1/t for the plain schedule.

        Computed literally (float32) rather than as 1/t so MDLM/BD3LM eval losses match the
        official ones bit for bit.
        """
        return -(self.alpha_prime(t) / (1 - self.alpha(t)))


@dataclass(frozen=True)
class StaggeredSchedule:
    """SetDLM's staggered per-position schedule (SPEC 1.2, the official ``StaggeredNoise``).

    N: positions the schedule covers (the official ``block_size``; the model length for SetDLM).
    d: BD3LM-equivalent block size (``desired_block_size``): per-token masking area d / (2N).
    M: maximum set size "smax" (``max_block_size``): with the default b (d not 1 or M),
       windows of positions M or more apart never overlap, so no token's rank moves M or more
       places. The official d == M branch (k = 1, b = d/N) only keeps that bound for d = N.
    k, b: shape and width of each position's window; ``from_sizes`` derives them from (N, d, M).

    Position j is masked during ``[loc_j, loc_j + b]`` with ``m_j = 1 - (1 - u)^k``,
    ``u = (t - loc_j) / b``; loc decreases from 1 - b (position 0) to 0 (position N - 1), so
    earlier positions are revealed earlier in reverse time. Everything is float64, as in the
    official code.
    """

    N: int
    d: int
    M: int
    k: float
    b: float

    def __post_init__(self) -> None:
        if not 1 <= self.d <= self.N:
            raise ValueError(f"need 1 <= d <= N, got d={self.d}, N={self.N}")
        if not 1 <= self.M <= self.N:
            raise ValueError(f"need 1 <= M <= N, got M={self.M}, N={self.N}")
        if not (self.k > 0 and 0 < self.b <= 1):
            raise ValueError(f"need k > 0 and 0 < b <= 1, got k={self.k}, b={self.b}")
        # The masking area b*k/(k+1) must equal d/(2N): that is what makes d the
        # BD3LM-equivalent block size. The official constructor asserts the same.
        area = self.k / (self.k + 1) * self.b
        if abs(area - self.desired_area) >= 1e-6:
            raise ValueError(f"area b*k/(k+1) = {area} does not match d/(2N) = {self.desired_area}")

    @classmethod
    def from_sizes(
        cls,
        N: int,
        d: int,
        M: int | None = None,
        k: float | None = None,
        b: float | None = None,
    ) -> StaggeredSchedule:
        """Derive k and b from (N, d, M) as the official ``StaggeredNoise`` does (SPEC 1.2).

        M defaults to min(2d, N): the paper's smax = 2d, capped at N as the official loader does
        (so d = N gives the uniform-order schedule). An explicit k or b overrides the default
        and the other one is solved from the area constraint.
        """
        if k is not None and b is not None:
            raise ValueError("give k or b, not both (construct the dataclass to set both)")
        if M is None:
            M = min(2 * d, N)
        # Same float operations as the official code, so b and k match it bit for bit.
        area = 1 / (2 * (N / d))
        if k is not None:
            b = area * (k + 1) / k
        elif b is not None:
            k = area / (b - area)
        elif d not in (1, M):
            # Window spacing (1 - b)/(N - 1) times M equals b: exactly M windows overlap.
            b = M / (N + M - 1)
            k = area / (b - area)
        else:
            k = 1.0
            b = area * (k + 1) / k
        return cls(N=N, d=d, M=M, k=float(k), b=float(b))

    @property
    def desired_area(self) -> float:
        """Per-token masking area d / (2N), computed as in the official code."""
        return 1 / (2 * (self.N / self.d))

    def loc(self) -> torch.Tensor:
        """Window starts, ``(N,)`` float64: ``linspace(0, 1 - b, N)`` flipped, largest first."""
        # torch.linspace (not the closed form) so the values match the official ones bitwise.
        return torch.linspace(0.0, 1.0 - self.b, self.N, dtype=torch.float64).flip(0)

    def _window_coordinate(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u = (t - loc) / b and log(1 - u) with u clamped to [0, 1 - eps], both float64."""
        u = (t.to(torch.float64) - self.loc()) / self.b  # broadcast(t, (N,))
        # log1p on the clamped u stays finite and accurate as k -> 0 and u -> 1.
        log_one_minus_u = torch.log1p(-u.clamp(0.0, 1.0 - torch.finfo(torch.float64).eps))
        return u, log_one_minus_u

    def alpha(self, t: torch.Tensor | float) -> torch.Tensor:
        """Per-position clean probability; t broadcasts against (N,) (pass (B, 1) per sequence).

        Returned in t's floating dtype (float64 for Python numbers and integer tensors).
        """
        t = _float_tensor(t, torch.float64)
        u, log_one_minus_u = self._window_coordinate(t)
        move_chance = -torch.expm1(self.k * log_one_minus_u)  # 1 - (1 - u)^k
        move_chance = torch.where(u >= 1.0, 1.0, move_chance)
        move_chance = torch.where(u <= 0.0, 0.0, move_chance)
        if self.d == 1:
            # Official rule: with d = 1 a position is masked as soon as its window opens.
            move_chance = torch.where(move_chance > 0.0, 1.0, move_chance)
        return 1 - move_chance.to(t.dtype)

    def alpha_prime(self, t: torch.Tensor | float) -> torch.Tensor:
        """Per-position d alpha / dt = -(k/b)(1 - u)^(k-1) for u in (0, 1], else 0."""
        t = _float_tensor(t, torch.float64)
        u, log_one_minus_u = self._window_coordinate(t)
        rate = -self.k / self.b * torch.exp((self.k - 1.0) * log_one_minus_u)
        rate = torch.where(u > 1.0, 0.0, rate)
        rate = torch.where(u <= 0.0, 0.0, rate)
        return rate.to(t.dtype)

    def first_hitting_times(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        exp_draws: torch.Tensor | None = None,
        length: int | None = None,
    ) -> torch.Tensor:
        """Reveal times ``T_j = loc_j + b (1 - exp(-E_j / k))``, E ~ Exp(1): ``(B, length)``.

        P(T_j <= t) = 1 - alpha_j(t); larger T means revealed earlier in reverse time.
        ``length`` (default N) keeps the last ``length`` windows, as the official code does for
        a canvas shorter than N. ``exp_draws`` (B, length) replays recorded Exp(1) draws;
        otherwise they come from ``generator`` (one float64 ``exponential_`` call, like the
        official global-RNG draw).
        """
        length = self.N if length is None else length
        if not 1 <= length <= self.N:
            raise ValueError(f"need 1 <= length <= N={self.N}, got {length}")
        if exp_draws is None:
            if generator is None:
                raise ValueError("pass a torch.Generator or exp_draws; the global RNG is not used")
            exp_draws = torch.empty(batch_size, length, dtype=torch.float64)
            exp_draws.exponential_(generator=generator)  # (B, length)
        elif exp_draws.shape != (batch_size, length):
            raise ValueError(f"exp_draws must be {(batch_size, length)}, got {exp_draws.shape}")
        loc = self.loc()[self.N - length :]  # (length,)
        return loc + self.b * -torch.expm1(-exp_draws.to(torch.float64) / self.k)  # (B, length)

    @staticmethod
    def order(first_hitting_times: torch.Tensor, permute_flag: torch.Tensor) -> torch.Tensor:
        """Generation order from reveal times (SPEC 1.3 step 3): ``(B, L)`` position indices.

        first_hitting_times: (B, L) reveal times. permute_flag: (B, L) bool, True where the
        token's place in the order is sampled (targets). The leading run of non-permuted
        tokens (prompt, kept-clean BOS) goes first in its original order (T = +inf) and the
        trailing run (padding) last in its original order (T = -inf); non-permuted tokens
        between targets keep their sampled T. Ties keep position order (stable sort).
        """
        permute_flag = permute_flag.bool()
        leading = permute_flag.cumsum(-1) == 0  # (B, L) before the first target
        trailing = permute_flag.flip(-1).cumsum(-1).flip(-1) == 0  # (B, L) after the last one
        times = torch.where(leading, math.inf, first_hitting_times)
        times = torch.where(trailing, -math.inf, times)
        return torch.argsort(times, dim=-1, descending=True, stable=True)  # (B, L)

    def sample_order(self, permute_flag: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Sample one order per sequence: ``order(first_hitting_times(B), permute_flag)``.

        permute_flag: (B, N) bool. Returns (B, N) int64 position indices, revealed first to
        last. Draws exactly what the official ``sample_permutation_order`` draws. The official
        caller skips the call (and its draw) when no token in the batch is permuted, using the
        identity order; a caller that follows its RNG stream must do the same.
        """
        batch_size, length = permute_flag.shape
        if length != self.N:
            raise ValueError(f"permute_flag length {length} must equal the schedule's N={self.N}")
        times = self.first_hitting_times(batch_size, generator=generator)  # (B, N)
        return self.order(times, permute_flag)

    def window_size(self) -> int:
        """The official ``compute_window_size``: N. Samplers use min(N, max_window_size)."""
        return self.N


def sample_t(
    batch_size: int,
    length: int,
    block_size: int | None,
    eps: float,
    generator: torch.Generator,
    antithetic: bool = False,
) -> torch.Tensor:
    """Training times as the official ``DenoisingCollator`` samples them: t = (1-eps) U + eps.

    block_size None: one t per sequence, shape (B,). Otherwise one t per block of
    ``block_size`` positions, repeated over the block, shape (B, length); block_size = length
    gives one t per sequence shaped (B, length). ``antithetic`` stratifies the B * num_blocks
    uniforms (the i-th lands in [i/n, (i+1)/n)). Float32, drawn with one ``torch.rand`` call of
    the official shape, so a generator seeded with s reproduces the official t after
    ``torch.manual_seed(s)``.

    The official antithetic branch only works when block_size == length: with block_size None
    its (B, 1) offsets broadcast the (B,) draws into (B, B), and with several blocks (B, length)
    does not broadcast against (B, num_blocks). Here the offsets are applied before the block
    repeat, which gives the official values wherever the official code works.
    """
    if block_size is None:
        uniforms = torch.rand(batch_size, generator=generator)  # (B,)
    else:
        if block_size <= 0 or length % block_size != 0:
            raise ValueError(f"length {length} is not a positive multiple of block {block_size}")
        uniforms = torch.rand(batch_size, length // block_size, generator=generator)  # (B, nb)
    if antithetic:
        n = uniforms.numel()
        offset = (torch.arange(n) / n).view(uniforms.shape)
        uniforms = (uniforms / n + offset) % 1
    t = (1 - eps) * uniforms + eps
    if block_size is not None:
        t = t.repeat_interleave(block_size, dim=-1)  # (B, length)
    return t
