"""The claims table (setdlm/report/claims.py builds its rows): one row per claim, the paper's
part first, each with its difference in its own unit, both unadjusted intervals, the
Holm-adjusted p-value and the verdict, and notes that state every rule the verdicts follow."""

from __future__ import annotations

from setdlm.eval.seeds import RESAMPLES
from setdlm.report.claim_stats import ALPHA, BEYOND, NO_EVIDENCE, PAPER, Claim
from setdlm.report.claims import build_claims, hardware_of
from setdlm.report.table import Column, Table
from setdlm.results.reader import Results

CLAIMS_KEY = "claims"


def claims_table(results: Results) -> Table:
    claims = build_claims(results)
    rows = [
        {
            "part": c.part,
            "claim": c.claim,
            "protocol": c.protocol,
            "comparison": c.comparison,
            "difference": (c.scale * c.difference, c.scale * c.low, c.scale * c.high),
            "unit": c.unit,
            "seed_level": None
            if c.seed_low is None
            else (None, c.scale * c.seed_low, c.scale * c.seed_high),
            "p_holm": c.adjusted_p,
            "verdict": c.verdict,
            "seeds": c.seeds,
            "examples": c.examples,
        }
        for c in claims
    ]
    return Table(
        CLAIMS_KEY,
        "SetDLM against BD3LM: the paper's claims at its protocol, and beyond the paper",
        [
            Column("part", "part"),
            Column("claim", "claim"),
            Column("protocol", "protocol from"),
            Column("comparison", "comparison"),
            Column("difference", "difference [two-level bootstrap 95 %]", 1, ranged=True),
            Column("unit", "unit"),
            Column("seed_level", "seed-level t 95 %", 1, ranged=True, show=_bounds),
            Column("p_holm", "p (Holm)", 3, show=_p),
            Column("verdict", "verdict"),
            Column("seeds", "seeds", 0),
            Column("examples", "examples per seed", 0),
        ],
        rows,
        _notes(claims, results),
    )


def _notes(claims: list[Claim], results: Results) -> list[str]:
    notes = [
        f"Two parts. {PAPER.capitalize()}: the paper's own comparisons at its protocol and on "
        "its axes: per task at τ = 1e6 (one token per step, so equal NFE) the quality, the "
        "tokens/s and the time per forward, and the solve accuracy at equal tokens/s along the "
        f"τ sweep (GSM8K's axis). {BEYOND.capitalize()}: comparisons the paper does not make "
        "(equal τ below 1e6, equal parallelism, the quality lost as τ falls; infilling and "
        "unconditional samples below τ = 1e6), what the miniature shows besides, not a test of "
        "the paper. 'protocol from' says where each row's comparison comes from.",
        "difference: SetDLM − BD3LM in the row's unit (time per forward: BD3LM − SetDLM), so the "
        "paper's side is positive. pp: percentage points of the quality (solve, infill: % of "
        "test problems; unconditional: % of samples that are correct problems); tok/s: "
        "generated tokens per second of a decode at batch 1, mean over the timed examples; "
        "µs/forward: a decode's wall time over its NFE.",
        f"Intervals (unadjusted, paired, 95 %): the two-level bootstrap of the crossed design "
        f"({RESAMPLES:,} seeded replicates, each drawing the training seeds and, once for all "
        "of them, the examples; both sides the same indices: same seeds, same problems; the "
        "unconditional samples are independent draws, resampled with the same indices)"
        f"{_mc_error_words(claims)}; and the seed-level Student t over the per-seed differences "
        "(n - 1 degrees of freedom), because a bootstrap over a handful of seeds is too narrow "
        "(it divides their variance by n and reads normal quantiles) and lets one seed carry a "
        "verdict.",
        "Verdicts: Holm's step-down over the rows of each part (family-wise "
        f"{100 * ALPHA:g} %), on each row's p-value, the larger of the bootstrap's (twice the "
        "share of replicates on the far side of 0) and the t test's. holds: the Holm-adjusted "
        f"p (shown) is below {ALPHA:g} and both unadjusted intervals exclude 0 on the paper's "
        "side; reversed: the same on the other side; no evidence: otherwise (judged "
        "unrounded; the CSV has every "
        f"number in full).{_leads(claims)}",
        "Parallelism: the official parallelism factor (tokens committed per step, an EOS and "
        "positions after it included: the paper's axis; setdlm/core/decoding/parallelism.py); "
        "each row at equal parallelism also gives both curves' tokens per forward (text tokens "
        "over NFE) at that factor.",
        "Models: SetDLM-smax2S against BD3LM-S (the paper's pairing), each with its own "
        "decoding policy; tiny CPU models on the synthetic arithmetic task, so these are the "
        "paper's comparisons in miniature, not its numbers (setdlm/report/claims.py).",
    ]
    timed = [c for c in claims if c.unit != "pp" or "tok/s" in c.claim]
    if timed:
        notes.append(
            "Speed (tokens/s, µs/forward and the equal-speed rows): the same run's batch-1 "
            f"timing on {hardware_of(results)}: the examples each point and seed decoded one "
            "at a time after its warm-up (speed.timed_examples; the others were decoded in "
            "batches, counted but not timed). SetDLM and BD3LM were timed in different jobs "
            "on a shared machine, so their intervals hold the spread between timed examples "
            "and seeds, not the machine's load between jobs. At equal speed the levels are the "
            "quartiles of the range both curves cover, each curve's points at their measured "
            "mean tokens/s."
        )
    if {c.seeds for c in claims} == {1}:
        notes.append(
            "One trained model per family: the interval resamples examples only and ignores "
            "seed variance, and there is no seed-level interval (train.seeds trains several)."
        )
    if not claims:
        notes.append(
            "No claim could be computed: the run has no SetDLM-smax2S and BD3LM-S pair on "
            "arithmetic-solve, arithmetic-infill or arithmetic-unconditional with per-example "
            "scores."
        )
    return notes


def _mc_error_words(claims: list[Claim]) -> str:
    if not claims:
        return ""
    worst = max(claims, key=lambda c: c.scale * c.mc_error if c.unit == "pp" else 0.0)
    return (
        f" (Monte-Carlo error of the printed bounds: at most {worst.scale * worst.mc_error:.2f} "
        "pp on the quality rows)"
    )


def _leads(claims: list[Claim]) -> str:
    """Rows whose unadjusted intervals both exclude 0 but which Holm does not confirm."""
    leads = [c for c in claims if c.side != NO_EVIDENCE and c.verdict == NO_EVIDENCE]
    if not leads:
        return " Holm changes no verdict the unadjusted intervals would give."
    words = "; ".join(f"{c.claim} ({c.side} unadjusted)" for c in leads)
    return f" Unadjusted leads Holm does not confirm: {words}."


def _bounds(cell: tuple[None, float, float]) -> str:
    """[low, high] of the seed-level interval, each with its sign: a bound of -0.002 reads
    "-0.0" beside a verdict of no evidence, where the other columns' format would print 0.0."""
    _, low, high = cell
    return f"[{low:.1f}, {high:.1f}]"


def _p(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"
