"""Noise schedules: official parity numbers, SPEC 1.2 closed forms, and order properties."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from setdlm.checkpoints.parity import check_schedules
from setdlm.core.schedules import LinearSchedule, StaggeredSchedule, sample_t

# The fixtures are bitwise on the recording machine's CPU; 1e-12 leaves room for another
# libm (one alpha' entry already differs by 1 ulp here) while staying far below 1e-6.
TIGHT = {"rtol": 1e-12, "atol": 1e-12}
F64 = torch.float64


@pytest.fixture(scope="module")
def staggered() -> StaggeredSchedule:
    return StaggeredSchedule.from_sizes(32, 4)


def _ranks(perm: torch.Tensor) -> torch.Tensor:
    """(B, L) order -> (B, L) rank of each position (its index in the order)."""
    return torch.argsort(perm, dim=-1)


# --------------------------------------------------------------------------------------------
# Official parity: noise_schedules.json, through the parity checker every user runs


def test_every_official_schedule_number_is_reproduced(parity_dir):
    checks = check_schedules(parity_dir / "noise_schedules.json")
    failing = [check.line() for check in checks if not check.passed]
    assert not failing, failing
    quantities = " ".join(check.quantity for check in checks)
    for expected in (
        "staggered b",
        "staggered k",
        "staggered loc",
        "alpha'(t=0.97)",
        "Exp(1) draws",
        "seed 11",
        "order, seed 3, prompt 3",
        "blocked alpha",
    ):
        assert expected in quantities


def test_the_schedule_check_fails_on_a_changed_number(parity_dir, tmp_path):
    recorded = json.loads((parity_dir / "noise_schedules.json").read_text())
    name = next(iter(recorded))
    recorded[name]["staggered"]["loc"][3] += 1e-9
    (tmp_path / "noise_schedules.json").write_text(json.dumps(recorded))
    failing = [
        c.quantity for c in check_schedules(tmp_path / "noise_schedules.json") if not c.passed
    ]
    assert failing == ["staggered loc (rel)"]


# --------------------------------------------------------------------------------------------
# Official parity: recorded orders and collator times in the model fixtures


def _load_case(parity_dir: Path, case: str) -> tuple[dict, dict]:
    folder = parity_dir / case
    return (
        json.loads((folder / "reference.json").read_text()),
        json.loads((folder / "config.json").read_text()),
    )


@pytest.mark.parametrize("case", ["setdlm-smax8-dit", "setdlm-smax8-qwen3"])
@pytest.mark.parametrize("mode", ["eval_loss", "train_loss"])
def test_recorded_setdlm_orders(parity_dir, case, mode):
    reference, config = _load_case(parity_dir, case)
    noise = config["noise_config"]
    schedule = StaggeredSchedule.from_sizes(
        noise["block_size"], noise["desired_block_size"], noise["max_block_size"]
    )
    inputs = reference["loss_inputs"]
    attention = torch.tensor(inputs["attention_mask"]).bool()  # (B, L)
    context = torch.tensor(inputs["context_mask"] or torch.zeros_like(attention).tolist()).bool()
    permute_flag = attention & ~context  # targets
    if config["keep_clean_bos"]:
        permute_flag[:, 0] = False
    recorded = reference[mode]
    expected_times = torch.tensor(recorded["first_hitting_times"], dtype=F64)  # (B, L)
    expected_perm = recorded["perm_indices"]

    # Replay: the recorded T alone determines the recorded order.
    assert StaggeredSchedule.order(expected_times, permute_flag).tolist() == expected_perm
    # Resample: the official draw is the first one after torch.manual_seed(global_torch_seed).
    generator = torch.Generator().manual_seed(recorded["global_torch_seed"])
    times = schedule.first_hitting_times(permute_flag.shape[0], generator=generator)
    torch.testing.assert_close(times, expected_times, **TIGHT)
    generator = torch.Generator().manual_seed(recorded["global_torch_seed"])
    assert schedule.sample_order(permute_flag, generator).tolist() == expected_perm


@pytest.mark.parametrize(
    "case",
    [
        "mdlm-dit",
        "mdlm-qwen3",
        "bd3lm-s4-dit",
        "bd3lm-s4-qwen3",
        "setdlm-smax8-dit",
        "setdlm-smax8-qwen3",
    ],
)
def test_sample_t_reproduces_recorded_collator_times(parity_dir, case):
    reference, config = _load_case(parity_dir, case)
    expected = torch.tensor(reference["loss_inputs"]["t"])
    batch_size, length = expected.shape[0], config["length"]
    # (B,) means one t per sequence; (B, L) is per block (BD3LM) or per sequence repeated.
    block_size = None if expected.ndim == 1 else (config.get("block_size") or length)
    # Not documented by the fixtures but true for all of them: the harness drew t first after
    # torch.manual_seed(construction_seed + 1).
    generator = torch.Generator().manual_seed(reference["init"]["construction_seed"] + 1)
    t = sample_t(batch_size, length, block_size, eps=1e-3, generator=generator)
    assert t.shape == expected.shape and t.dtype == torch.float32
    torch.testing.assert_close(t, expected, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# SPEC 1.2 closed forms and statistics


@pytest.mark.parametrize(
    ("N", "d", "M", "b", "k"),
    [
        (1024, 4, 8, "0.00776", "0.336"),
        (1024, 8, 16, "0.01540", "0.340"),
        (1024, 16, 32, "0.03033", "0.347"),
        (128, 4, 8, "0.0593", "0.358"),
        (128, 16, 32, "0.2013", "0.450"),
        (768, 16, 32, "0.0400", "0.352"),
    ],
)
def test_spec_table_b_and_k(N, d, M, b, k):
    schedule = StaggeredSchedule.from_sizes(N, d)
    assert schedule.M == M
    # Exact closed forms of SPEC 1.2 ...
    area = d / (2 * N)
    assert schedule.b == pytest.approx(M / (N + M - 1), rel=1e-15)
    assert schedule.k == pytest.approx(area / (schedule.b - area), rel=1e-15)
    assert schedule.k / (schedule.k + 1) * schedule.b == pytest.approx(area, rel=1e-12)
    # ... and the table's printed values, to one unit of their last digit (the N=768 row
    # prints b = 0.0400 for 32/799 = 0.040050, which is truncated rather than rounded).
    for got, printed in [(schedule.b, b), (schedule.k, k)]:
        unit = 10.0 ** -len(printed.split(".")[1])
        assert abs(got - float(printed)) <= unit, (got, printed)
    # Window spacing (1 - b)/(N - 1) times M is b: the geometry behind smax.
    spacing = (1 - schedule.b) / (N - 1)
    assert schedule.b / spacing == pytest.approx(M, rel=1e-12)


def test_spec_table_rank_displacement_statistics():
    # Row N=128, d=4: mean |rank - pos| 1.76, max 7 over 50 draws.
    schedule = StaggeredSchedule.from_sizes(128, 4)
    perm = schedule.sample_order(
        torch.ones(50, 128, dtype=torch.bool), torch.Generator().manual_seed(0)
    )
    displacement = (_ranks(perm) - torch.arange(128)).abs().double()
    assert 1.6 < displacement.mean().item() < 1.95
    assert displacement.max().item() == 7


def test_special_cases_closed_form():
    ar = StaggeredSchedule.from_sizes(16, 1)
    assert (ar.k, ar.b) == (1.0, 1 / 16)
    uniform = StaggeredSchedule.from_sizes(16, 16)
    assert (uniform.M, uniform.k, uniform.b) == (16, 1.0, 1.0)
    assert torch.equal(uniform.loc(), torch.zeros(16, dtype=F64))
    # Official d == M branch (d not 1 or N): k = 1 and b = d/N, not b = M/(N + M - 1).
    equal = StaggeredSchedule.from_sizes(32, 4, M=4)
    assert (equal.k, equal.b) == (1.0, 4 / 32)


def test_explicit_k_or_b_override():
    area = 4 / (2 * 64)
    with_k = StaggeredSchedule.from_sizes(64, 4, k=0.5)
    assert with_k.k == 0.5 and with_k.b == pytest.approx(area * 1.5 / 0.5)
    with_b = StaggeredSchedule.from_sizes(64, 4, b=0.1)
    assert with_b.b == 0.1 and with_b.k == pytest.approx(area / (0.1 - area))


def test_first_hitting_times_follow_alpha():
    # P(T_j <= t) = 1 - alpha_j(t), checked on 20000 draws at a few times.
    schedule = StaggeredSchedule.from_sizes(32, 4)
    times = schedule.first_hitting_times(20000, generator=torch.Generator().manual_seed(5))
    for t in (0.2, 0.5, 0.8):
        empirical = (times <= t).double().mean(0)  # (N,)
        expected = 1 - schedule.alpha(torch.tensor(t, dtype=F64))
        assert (empirical - expected).abs().max().item() < 0.02


def test_alpha_prime_is_the_derivative_of_alpha():
    schedule = StaggeredSchedule.from_sizes(32, 4)
    h = 1e-7
    for t in (0.3, 0.6):
        time = torch.tensor([[t]], dtype=F64)
        numeric = (schedule.alpha(time + h) - schedule.alpha(time - h)) / (2 * h)
        torch.testing.assert_close(schedule.alpha_prime(time), numeric, rtol=1e-5, atol=1e-5)


def test_shorter_canvas_uses_the_last_windows():
    schedule = StaggeredSchedule.from_sizes(32, 4)
    draws = torch.rand(3, 10, generator=torch.Generator().manual_seed(1), dtype=F64)
    short = schedule.first_hitting_times(3, exp_draws=draws, length=10)
    padded = torch.cat([torch.zeros(3, 22, dtype=F64), draws], dim=-1)
    full = schedule.first_hitting_times(3, exp_draws=padded)
    torch.testing.assert_close(short, full[:, 22:], rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Order properties


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 64), seed=st.integers(0, 2**31 - 1))
def test_d1_gives_left_to_right_order(n, seed):
    schedule = StaggeredSchedule.from_sizes(n, 1)
    perm = schedule.sample_order(
        torch.ones(8, n, dtype=torch.bool), torch.Generator().manual_seed(seed)
    )
    assert torch.equal(perm, torch.arange(n).expand(8, n))


def test_d_equals_n_gives_uniform_order():
    n, draws = 8, 16000
    schedule = StaggeredSchedule.from_sizes(n, n)
    perm = schedule.sample_order(
        torch.ones(draws, n, dtype=torch.bool), torch.Generator().manual_seed(0)
    )
    # Each position is first, and last, draws/n = 2000 times in expectation; the standard
    # deviation is about 42, and the seed is fixed, so +-250 cannot flake.
    for column in (0, n - 1):
        counts = torch.bincount(perm[:, column], minlength=n)
        assert (counts - draws // n).abs().max().item() < 250, counts
    # Ranks are uniform too: every position's mean rank is (n - 1) / 2.
    mean_rank = _ranks(perm).double().mean(0)
    assert (mean_rank - (n - 1) / 2).abs().max().item() < 0.1


@settings(max_examples=60, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_no_token_moves_m_or_more_places(data, seed):
    n = data.draw(st.integers(2, 96), label="N")
    d = data.draw(st.integers(1, n // 2), label="d")
    schedule = StaggeredSchedule.from_sizes(n, d)
    assert 2 * d == schedule.M
    perm = schedule.sample_order(
        torch.ones(16, n, dtype=torch.bool), torch.Generator().manual_seed(seed)
    )
    displacement = (_ranks(perm) - torch.arange(n)).abs()
    assert displacement.max().item() < schedule.M


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.integers(0, 6),
    targets=st.integers(0, 12),
    padding=st.integers(0, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_order_puts_prompt_first_and_padding_last(prompt, targets, padding, seed):
    length = prompt + targets + padding
    if length == 0:
        return
    permute_flag = torch.zeros(2, length, dtype=torch.bool)
    permute_flag[:, prompt : prompt + targets] = True
    times = torch.rand(2, length, generator=torch.Generator().manual_seed(seed), dtype=F64)
    perm = StaggeredSchedule.order(times, permute_flag)
    for row, row_times in zip(perm.tolist(), times.tolist(), strict=True):
        assert sorted(row) == list(range(length))
        if targets == 0:  # nothing to permute: identity
            assert row == list(range(length))
            continue
        assert row[:prompt] == list(range(prompt))
        assert row[length - padding :] == list(range(prompt + targets, length))
        middle = row[prompt : prompt + targets]
        assert sorted(middle) == list(range(prompt, prompt + targets))
        # Targets come in descending T, ties by position.
        keys = [(-row_times[j], j) for j in middle]
        assert keys == sorted(keys)


def test_order_keeps_interior_non_targets_at_their_sampled_time():
    # Only the leading and trailing runs are pinned; a non-target between targets keeps T.
    times = torch.tensor([[0.1, 0.9, 0.5, 0.2, 0.8]], dtype=F64)
    permute_flag = torch.tensor([[False, True, False, True, False]])
    assert StaggeredSchedule.order(times, permute_flag).tolist() == [[0, 1, 2, 3, 4]]
    times = torch.tensor([[0.1, 0.2, 0.9, 0.5, 0.8]], dtype=F64)
    assert StaggeredSchedule.order(times, permute_flag).tolist() == [[0, 2, 3, 1, 4]]


def test_sampling_never_touches_the_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    schedule = StaggeredSchedule.from_sizes(16, 4)
    generator = torch.Generator().manual_seed(0)
    schedule.sample_order(torch.ones(4, 16, dtype=torch.bool), generator)
    sample_t(4, 16, 4, 1e-3, generator, antithetic=True)
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.raises(ValueError, match="Generator"):
        schedule.first_hitting_times(2)


# --------------------------------------------------------------------------------------------
# Linear schedule and collator times


def test_linear_loss_weight_is_one_over_t():
    t = torch.tensor([1e-3, 0.1, 0.5, 0.9, 1.0])
    schedule = LinearSchedule()
    # float32 1 - (1 - t) cancels: about 1e-5 relative error at t = 1e-3, as in the official code.
    torch.testing.assert_close(schedule.loss_weight(t), 1 / t, rtol=5e-5, atol=0)
    torch.testing.assert_close(schedule.alpha(t), 1 - t)
    assert torch.equal(schedule.alpha_prime(t), -torch.ones(5))


def test_linear_blocked_windows():
    schedule = LinearSchedule(block_size=4, length=16)
    # Block i of 4 is masked while t is in [(3 - i)/4, (4 - i)/4]: at t = 0.6 block 0 is clean,
    # block 1 is part-way (alpha = 1 - (0.6 - 0.5) * 4) and blocks 2 and 3 are masked.
    alpha = schedule.alpha(torch.tensor([[0.6]]))  # (1, 16)
    expected = torch.tensor([1.0] * 4 + [1 - (0.6 - 0.5) * 4] * 4 + [0.0] * 8)
    torch.testing.assert_close(alpha[0], expected)


@pytest.mark.parametrize(("block_size", "shape"), [(None, (6,)), (4, (6, 16)), (16, (6, 16))])
def test_sample_t_shapes_and_range(block_size, shape):
    t = sample_t(6, 16, block_size, eps=0.05, generator=torch.Generator().manual_seed(0))
    assert t.shape == shape and t.dtype == torch.float32
    assert (t >= 0.05).all() and (t <= 1.0).all()
    if block_size is not None:
        blocks = t.view(6, 16 // block_size, block_size)
        assert torch.equal(blocks, blocks[..., :1].expand_as(blocks))


@pytest.mark.parametrize("block_size", [None, 4])
def test_sample_t_antithetic_is_stratified(block_size):
    eps = 1e-3
    t = sample_t(5, 16, block_size, eps, torch.Generator().manual_seed(2), antithetic=True)
    per_draw = t if block_size is None else t[:, ::block_size]  # (B,) or (B, num_blocks)
    uniforms = ((per_draw - eps) / (1 - eps)).flatten()
    n = uniforms.numel()
    strata = torch.floor(uniforms * n + 1e-4).long().clamp(max=n - 1)
    assert strata.tolist() == list(range(n))


# --------------------------------------------------------------------------------------------
# Validation


def test_schedules_are_frozen_and_validated():
    schedule = StaggeredSchedule.from_sizes(32, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.k = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        LinearSchedule().eps = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="area"):
        StaggeredSchedule(N=32, d=4, M=8, k=1.0, b=0.5)
    with pytest.raises(ValueError, match="M"):
        StaggeredSchedule.from_sizes(32, 4, M=64)
    with pytest.raises(ValueError, match="not both"):
        StaggeredSchedule.from_sizes(32, 4, k=0.5, b=0.2)
    with pytest.raises(ValueError):
        StaggeredSchedule.from_sizes(32, 8, M=4)  # b < d/(2N) gives k < 0
    with pytest.raises(ValueError, match="equal"):
        schedule.sample_order(torch.ones(1, 16, dtype=torch.bool), torch.Generator())
    with pytest.raises(ValueError, match="both"):
        LinearSchedule(block_size=4)
    with pytest.raises(ValueError, match="multiple"):
        LinearSchedule(block_size=5, length=32)
    assert math.isclose(schedule.desired_area, 4 / 64)
