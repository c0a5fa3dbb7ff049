"""Speed-ups an independent clock reproduces: an interval from paired rounds, against all-FP32 and the
given model, and no unproven gain shipped."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from builders import conv_with_data

import autoprec
from autoprec.analysis.data import Workload
from autoprec.app.cli import main
from autoprec.backends import int8_sums
from autoprec.backends import onnxruntime as onnxruntime_backend
from autoprec.core.errors import AutoprecError
from autoprec.core.timing import Timing
from autoprec.measure import measurement
from autoprec.measure.measurement import InProcessMeasurer
from autoprec.measure.speedup import (
    MAX_BLOCKS,
    MIN_BLOCKS,
    MOVED_BLOCKS,
    bounded,
    contender,
    known,
    time_until_known,
)
from autoprec.record.trial import Paired
from autoprec.record.verdict import (
    BUSY_ROUNDS_PER_BLOCK,
    ROUNDS_PER_BLOCK,
    Rounds,
    Speedup,
    speedup,
)


def _rounds(ms: float, spread: float, count: int, seed: int) -> list[float]:
    return list(ms * (1 + spread * np.random.default_rng(seed).normal(size=count)))


def _final(ms: dict[str, float], spread: float = 0.01, rounds: int = 12) -> Rounds:
    """A final timing's rounds (two a block) in which each model runs at its ``ms``, with ``spread`` of noise."""
    return Rounds({name: tuple(Timing(v, v, v, 10, 3) for v in _rounds(value, spread, rounds, seed))
                   for seed, (name, value) in enumerate(ms.items())}, tuple(i // 2 for i in range(rounds)))


def _sessions(gain: float, session_spread: float, seed: int, blocks: int = MIN_BLOCKS,
              per_block: int = ROUNDS_PER_BLOCK) -> tuple[list, list, list]:
    """Rounds of all-FP32 and a plan ``gain`` × faster, each block's sessions off by their own lasting amount
    (``session_spread``), the rounds within a block by 0.2 %: what rebuilding the sessions samples."""
    rng = np.random.default_rng(seed)
    fp32, plan, block_of = [], [], []
    for block in range(blocks):
        a, b = 10 * (1 + session_spread * rng.normal()), 10 / gain * (1 + session_spread * rng.normal())
        for _ in range(per_block):
            fp32.append(a * (1 + 0.002 * rng.normal()))
            plan.append(b * (1 + 0.002 * rng.normal()))
            block_of.append(block)
    return fp32, plan, block_of


def test_a_plan_against_itself_is_beyond_noise_no_more_often_than_the_level_says_when_sessions_differ():
    """Two sessions of one graph differ by a lasting 1.5 % (memory placement, thread pools): rounds of one pair of
    sessions resample only the 0.2 % noise, and called such a pair "faster" about half the time; sessions built
    anew for every block, and the blocks' t-interval, hold its 2.5 %."""
    called = [speedup(*_sessions(1.0, 0.015, seed)).beyond_timing_noise for seed in range(200)]
    one_pair = [speedup(*_sessions(1.0, 0.015, seed, blocks=1, per_block=12)[:2]).beyond_timing_noise
                for seed in range(200)]
    assert sum(called) <= 10 and sum(one_pair) >= 60


def test_a_three_percent_gain_is_still_found_across_sessions():
    found = [speedup(*_sessions(1.03, 0.005, seed)).beyond_timing_noise for seed in range(50)]
    assert sum(found) >= 45


def test_a_load_that_moves_all_fp32s_fastest_runs_between_blocks_widens_the_interval_and_is_said():
    steady = _final({"fp32": 10.0, "chosen": 5.0})
    busy = Rounds(steady.timings, steady.blocks, (0.1, 0.1, 1.6, 1.6, 1.7, 1.6))
    slower = {name: tuple(Timing(t.median_ms * f, t.p10_ms * f, t.p90_ms * f, 10, 3)
                          for t, f in zip(found, [1.0] * 4 + [1.4] * 8))
              for name, found in steady.timings.items()}
    moved = Rounds(slower, steady.blocks, busy.load)
    assert not steady.steadiness().moved and not busy.steadiness().moved
    assert moved.steadiness().moved
    narrow, wide = busy.speedup("fp32", "chosen"), moved.speedup("fp32", "chosen")
    assert narrow == steady.speedup("fp32", "chosen")  # a load the fastest runs held: no wider
    assert wide.unsteady and wide.low <= narrow.low and wide.high >= narrow.high
    said = moved.steadiness().said()
    assert "other processes used 0.1–1.7 of this machine's" in said and "--threads N" in said
    assert "fastest runs, which that load cannot make faster" in busy.steadiness().said()
    assert Rounds.from_json(moved.to_json()) == moved


def test_all_fp32s_sessions_apart_on_a_quiet_machine_are_said_as_the_sessions_not_a_load():
    """On an H200 with nothing else running all-FP32's fresh CUDA sessions ran 13 % apart: the warning names the
    sessions, not a load that was not there (nor threads and a quieter machine as the cure)."""
    steady = _final({"fp32": 10.0, "chosen": 5.0}, spread=0.0)
    apart = {name: tuple(Timing(t.median_ms * f, t.p10_ms * f, t.p90_ms * f, 10, 3)
                         for t, f in zip(found, [1.0] * 4 + [1.13] * 8))
             for name, found in steady.timings.items()}
    quiet = Rounds(apart, steady.blocks, (0.0, 0.01, 0.0, 0.01, 0.0, 0.0))
    said = quiet.steadiness().said()
    assert quiet.steadiness().moved and "sessions ran 13 % apart" in said and "at most 0.0 of" in said
    assert "load moved" not in said and "--threads" not in said


def test_a_hog_for_half_the_timing_gives_an_interval_that_holds_at_either_load():
    """A hog slows FP32 and an INT8 plan unalike (2.2× unloaded, 2.5× loaded): over 30 blocks the t-interval
    alone sits between the two, true at neither; split by the load, the interval covers both."""
    rng = np.random.default_rng(0)
    loads = [0.1] * 15 + [1.1] * 15
    gains = [2.2 if load < 1 else 2.5 for load in loads]
    fp32 = [10 * (1 + 0.003 * rng.normal()) * (1.5 if load > 1 else 1) for load in loads for _ in range(2)]
    plan = [f / gain * (1 + 0.003 * rng.normal()) for f, gain in zip(fp32, [g for g in gains for _ in range(2)])]
    blocks = [i // 2 for i in range(60)]
    steady = speedup(fp32, plan, blocks)
    assert not (steady.low <= 2.2 and steady.high >= 2.5)
    hogged = Rounds({"fp32": tuple(Timing(v, v, v, 10, 3) for v in fp32),
                     "chosen": tuple(Timing(v, v, v, 10, 3) for v in plan)}, tuple(blocks), tuple(loads))
    found = hogged.speedup("fp32", "chosen")
    assert found.unsteady and found.low <= 2.2 * 1.01 and found.high >= 2.5 / 1.01 and found.high < 2.7


def test_a_level_that_jumps_between_sessions_neither_invents_a_gain_nor_hides_a_real_one():
    """A machine whose speed jumps by a third between sessions (a clock, a neighbour in another VM: seen on this
    project's VMs), sessions 2 % apart besides: the level moves, so the blocks are split by the pair's own level.
    A/A is beyond noise in at most 5 % and a 5 % gain is still found in most (widening the interval to the
    blocks' extremes, as first done, found it in 47 of 100)."""
    def timed(gain: float, seed: int) -> Speedup:
        rng = np.random.default_rng(seed + 1000)
        fp32, plan, blocks = _sessions(gain, 0.02, seed, blocks=20)
        level = [1 + 0.33 * rng.integers(0, 2) for _ in range(20)]
        rounds = Rounds({"fp32": tuple(Timing(v, v, v, 10, 3) for v in np.multiply(fp32, np.repeat(level, ROUNDS_PER_BLOCK))),
                         "chosen": tuple(Timing(v, v, v, 10, 3) for v in np.multiply(plan, np.repeat(level, ROUNDS_PER_BLOCK)))},
                        tuple(blocks))
        assert rounds.steadiness().moved
        return rounds.speedup("fp32", "chosen")

    assert sum(timed(1.0, seed).beyond_timing_noise for seed in range(100)) <= 5
    assert sum(timed(1.05, seed).beyond_timing_noise for seed in range(50)) >= 45


def _hogged(gain: float, seed: int, blocks: int = 8) -> Rounds:
    """A final timing beside a CPU hog that switches on and off (issue 69): each model's turn in a
    round is quiet, hit in part (the hog took some of its runs: its median 20–150 % slower, its fast
    runs as quiet) or hit whole (every run slower, by 30–120 %); sessions 1 % apart. Interference
    only ever adds time."""
    rng = np.random.default_rng(seed)
    timings: dict[str, list[Timing]] = {"fp32": [], "chosen": []}
    loads = []
    for _ in range(blocks):
        session = {"fp32": 10.0 * (1 + 0.01 * rng.normal()),
                   "chosen": 10.0 / gain * (1 + 0.01 * rng.normal())}
        hit = 0
        for _ in range(BUSY_ROUNDS_PER_BLOCK):  # (a hog keeps the machine busy)
            for name, ms in session.items():
                turn = rng.choice(["quiet", "part", "whole"], p=[0.4, 0.4, 0.2])
                whole = 1 + rng.uniform(0.3, 1.2) * (turn == "whole")
                fast = ms * (1 + 0.003 * abs(rng.normal())) * whole
                median = fast * (1.02 + rng.uniform(0.2, 1.5) * (turn != "quiet"))
                timings[name].append(Timing(median, fast, median * 1.3, 10, 3))
                hit += turn != "quiet"
        loads.append(hit / (2 * BUSY_ROUNDS_PER_BLOCK) * 1.8)
    blocks_of = tuple(i // BUSY_ROUNDS_PER_BLOCK for i in range(blocks * BUSY_ROUNDS_PER_BLOCK))
    return Rounds({k: tuple(v) for k, v in timings.items()}, blocks_of, tuple(loads))


def test_a_hog_switching_on_and_off_neither_hides_a_real_gain_nor_invents_one():
    """Issue 69: on a loaded 2-core machine a held-out detector's 1.6× INT8 plan read 1.59×
    (0.83–3.02) from the rounds' medians and was not shipped. Each session's fastest runs, which a
    hog cannot make faster, see a 1.5× gain in most timings (84 of 100) and still call a plan
    faster than itself no more often than the level says."""
    found = [_hogged(1.5, seed).speedup("fp32", "chosen") for seed in range(100)]
    assert sum(s.beyond_timing_noise for s in found) >= 80  # (the rounds' medians: 3 of 100)
    assert abs(np.median([s.speedup for s in found]) / 1.5 - 1) < 0.02
    same = [_hogged(1.0, seed).speedup("fp32", "chosen") for seed in range(100)]
    assert sum(s.beyond_timing_noise for s in same) <= 5


@pytest.mark.parametrize("others", [0.0, 1.0])
def test_every_block_builds_every_session_anew_and_a_slow_model_gets_its_blocks(conv_model, monkeypatch, others):
    """However short the time given, the final timing runs MIN_BLOCKS blocks (MOVED_BLOCKS where the machine's load
    moved: its interval covers each half of the blocks), each model's session built for each; a block times one
    round where other processes leave the machine quiet, two where they keep a core busy."""
    from autoprec.measure.speedup import LoadProbe

    monkeypatch.setattr(LoadProbe, "others", lambda self: others)
    from autoprec.analysis.model import analyse
    from autoprec.backends import get_backend
    from autoprec.core.search_space import load_search_space

    info = analyse(conv_model, load_search_space())
    backend, built = get_backend("ort-cpu"), []
    runner = backend.runner
    backend.runner = lambda model: built.append(model) or runner(model)
    batch = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    found = time_until_known(backend, {"fp32": info.stored, "chosen": info.stored}, Workload.of(batch),
                             [("fp32", "chosen")], 0)
    blocks = len(set(found.blocks))  # eight where the load moved: four blocks in each half of its interval
    rounds = BUSY_ROUNDS_PER_BLOCK if others or found.steadiness().moved else ROUNDS_PER_BLOCK
    assert MIN_BLOCKS <= blocks <= MOVED_BLOCKS and found.count <= blocks * rounds
    assert found.count == blocks * rounds or found.steadiness().moved
    assert len(built) == 2 * blocks and len(found.load) == blocks


def test_once_all_fp32s_level_moved_each_block_times_two_rounds(conv_model, monkeypatch):
    """A quiet machine whose sessions run 30 % slower every other block (a neighbour on the host):
    from the block after the move on, each session's fastest runs stand on two turns, and the
    timing stops once six blocks or more hold two rounds a block on the whole."""
    from autoprec.analysis.model import analyse
    from autoprec.backends import get_backend
    from autoprec.core.search_space import load_search_space
    from autoprec.measure import speedup as timing
    from autoprec.measure.speedup import NARROW_BLOCKS, LoadProbe

    monkeypatch.setattr(LoadProbe, "others", lambda self: 0.0)
    backend, built, rng = get_backend("ort-cpu"), [], np.random.default_rng(0)
    runner = backend.runner
    backend.runner = lambda model: built.append(model) or runner(model)

    def time_work(session, work, runs):
        level = (1.3 if (len(built) - 1) // 2 % 2 else 1.0) * (1 + 0.05 * rng.random())
        return (Timing(level, level, level, 10, 3),)

    monkeypatch.setattr(timing, "time_work", time_work)
    stored = analyse(conv_model, load_search_space()).stored
    found = time_until_known(backend, {"fp32": stored, "chosen": stored},
                             Workload.of({"x": np.zeros((1, 3, 16, 16), np.float32)}), [("fp32", "chosen")], 0)
    per_block = [found.blocks.count(b) for b in dict.fromkeys(found.blocks)]
    assert found.steadiness().moved and per_block[:2] == [1, 1] and set(per_block[2:]) == {2}
    assert found.count == NARROW_BLOCKS * BUSY_ROUNDS_PER_BLOCK and len(per_block) == NARROW_BLOCKS + 1


def _stopped(gain: float, seed: int, last: int, deciding: bool, spread: float = 0.015) -> Speedup:
    """A final timing of all-FP32 and a plan ``gain`` x faster (sessions off by a lasting ``spread``), stopped where
    :func:`known` says (``deciding``: also where the plan is known faster or slower) or after ``last`` blocks."""
    fp32, plan, block_of = _sessions(gain, spread, seed, blocks=last)
    for blocks in range(MIN_BLOCKS, last + 1):
        rounds = blocks * ROUNDS_PER_BLOCK
        found = Rounds({"fp32": tuple(Timing(v, v, v, 10, 3) for v in fp32[:rounds]),
                        "chosen": tuple(Timing(v, v, v, 10, 3) for v in plan[:rounds])}, tuple(block_of[:rounds]))
        if known(found, [("fp32", "chosen")], [("fp32", "chosen")] if deciding else ()):
            break
    return found.speedup("fp32", "chosen")


def test_stopping_once_the_choice_is_decided_calls_a_plan_against_itself_faster_no_more_often():
    """The final timing stops as soon as the plan is known faster or slower; looking after every block must not
    call a plan timed against itself faster more often than timing to the end does (a 95 % interval: about 2.5 %),
    and a real 10 % gain is found as often, in fewer blocks."""
    runs = range(600)
    same = [_stopped(1.0, seed, 10, True).beyond_timing_noise for seed in runs]
    to_the_end = [_stopped(1.0, seed, 10, False).beyond_timing_noise for seed in runs]
    assert sum(same) <= sum(to_the_end) + 5 and sum(same) / len(runs) < 0.04
    gains = [_stopped(1.1, seed, 10, True) for seed in range(100)]
    slow = [_stopped(1.1, seed, 10, False) for seed in range(100)]
    assert sum(g.beyond_timing_noise for g in gains) >= sum(g.beyond_timing_noise for g in slow) - 4
    assert np.mean([g.blocks for g in gains]) < np.mean([g.blocks for g in slow]) - 1 and MAX_BLOCKS >= 10


def test_a_plan_no_faster_than_all_fp32_stops_the_timing_at_the_fewest_blocks():
    """Issue 68: INT8 on a CPU without fast INT8 kernels (yolov8n at 0.99x) took six blocks and 14 s of a 73 s
    search to end not shipped. A plan that ran no faster in the blocks so far ships only if more blocks turn its
    ratio round: the timing stops at MIN_BLOCKS, the plan not shipped; a plan a little faster is still timed on."""
    slower = [_stopped(0.97, seed, 10, True) for seed in range(50)]
    assert all(s.blocks == MIN_BLOCKS and not s.beyond_timing_noise for s in slower)
    faster = [_stopped(1.03, seed, 10, True) for seed in range(50)]
    assert sum(s.blocks > MIN_BLOCKS for s in faster) >= 40
    # sessions 30 % apart (the machine's latency moved): no stop before the interval says something (ppocr-rec's
    # stopped at 0.00-inf, which no result can hold)
    unsteady = [_stopped(0.97, seed, 10, True, spread=0.3) for seed in range(50)]
    assert all(0 < s.low and np.isfinite(s.high) for s in unsteady)


def test_two_samples_of_one_plan_are_not_called_faster():
    for seed in range(20):  # the old verdict (every round beats every round) fell for 1 in 20 of these
        found = speedup(_rounds(10.0, 0.05, 6, seed), _rounds(10.0, 0.05, 6, 100 + seed))
        assert found.low < 1.0 < found.high or not found.beyond_timing_noise


def test_a_real_gain_has_an_interval_around_it_and_beyond_noise():
    found = speedup(_rounds(13.0, 0.02, 12, 1), _rounds(10.0, 0.02, 12, 2))
    assert found.beyond_timing_noise and found.low > 1.2 and found.high < 1.4
    assert found.low < found.speedup < found.high and found.rounds == 12 and found.confidence == 0.95
    assert (
        speedup(_rounds(13.0, 0.02, 12, 1), _rounds(10.0, 0.02, 12, 2)) == found
    )  # seeded: the same rounds, the same interval


def test_drift_that_hits_a_round_alike_does_not_widen_the_interval():
    drift = np.linspace(1.0, 1.6, 10)  # the machine slows down by 60 % over the rounds
    found = speedup(list(13.0 * drift), list(10.0 * drift))
    assert found.low == pytest.approx(1.3) and found.high == pytest.approx(1.3)


def test_a_search_states_its_speed_ups_with_intervals(tmp_path):
    model, data = conv_with_data(tmp_path, items=12)
    out = tmp_path / "out"
    autoprec.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            study=autoprec.StudySpec(budget=4, warm_start=False),
            out=out,
            retime_seconds=2,
            ship_within_noise=True,
        )
    )
    pareto = json.loads((out / "pareto.json").read_text())
    if pareto["final_timing"] is None:  # all-FP32 chosen, nothing within 15 % of it: nothing to decide
        assert pareto["chosen"] == pareto["uniform"]["fp32"] and not pareto["final_rivals"]
        assert pareto["chosen_vs_source"] is None
        return
    for key in ("chosen_vs_fp32", "chosen_vs_source"):
        versus = pareto[key]
        if versus is None:  # the all-FP32 plan chosen: no speed-up over itself
            assert key == "chosen_vs_fp32" and pareto["chosen"] == pareto["uniform"]["fp32"]
            continue
        assert versus["low"] <= versus["speedup"] <= versus["high"] and versus["confidence"] == 0.95
        assert versus["rounds"] >= MIN_BLOCKS * ROUNDS_PER_BLOCK and versus["blocks"] >= MIN_BLOCKS
        assert versus["beyond_timing_noise"] == (versus["low"] > 1)
    assert pareto["final_timing"]["cores"] >= 1
    assert "preparation" in pareto["chosen_vs_source"]  # how much of the gain is autoprec's FP32 preparation


def _searched_with(tmp_path, monkeypatch, final_timing, budget: int, max_loss: float, retimed=None):
    """A search in this process whose re-timing (``retimed``; by default every reduced plan tied, twice as fast as
    all-FP32) and final timing are given: its result folder and pareto.json."""
    monkeypatch.setattr(InProcessMeasurer, "time_paired", retimed or _reduced_twice_as_fast)
    model, data = conv_with_data(tmp_path, items=12)
    out = tmp_path / "out"
    assert main(["search", str(model), "--data", str(data), "--out", str(out), "--budget", str(budget),
                 "--no-isolation", "--no-progress", "--no-warm-start", "--max-loss", str(max_loss)],
                final_timing=final_timing) == 0
    return out, json.loads((out / "pareto.json").read_text())


def _reduced_twice_as_fast(self, reference, plan, rounds, dominated_ms=None, reduced_ms=5.0):
    """A re-timing in which every reduced plan runs twice as fast as all-FP32: they all tie, one is chosen."""
    ms = 10.0 if plan.counts()["int8"] + plan.counts()["fp16"] == 0 else reduced_ms
    return Paired(tuple(Timing(10.0, 10.0, 10.0, 10, 3) for _ in range(rounds)),
                  tuple(Timing(ms, ms, ms, 10, 3) for _ in range(rounds)), 0, False)


def test_an_all_fp32_choice_no_plan_contends_with_is_not_timed_again(tmp_path, monkeypatch, capsys):
    """Every reduced plan re-times twice as slow as all-FP32, so all-FP32 is chosen and no plan comes within 15 %
    of it: the final timing, which would decide nothing, does not run, and the terminal says why."""

    def slower(self, reference, plan, rounds, dominated_ms=None):
        return _reduced_twice_as_fast(self, reference, plan, rounds, reduced_ms=20.0)

    out, pareto = _searched_with(tmp_path, monkeypatch, lambda *args: pytest.fail("timed a choice with nothing to decide"),
                                 budget=4, max_loss=0.5, retimed=slower)
    assert pareto["chosen"] == pareto["uniform"]["fp32"] and pareto["final_timing"] is None
    assert pareto["chosen_vs_source"] is None and pareto["not_shipped"] is None
    assert "no plan contends with it: no final timing" in " ".join(capsys.readouterr().err.split())


def test_a_plan_not_faster_beyond_noise_is_not_shipped(tmp_path, monkeypatch, capsys):
    """A re-timing that makes a reduced plan the choice, then final timings in which it and all-FP32 are one
    distribution: best/ holds all-FP32, and the plan is named."""

    def alike(measurer, fp32, contenders, seconds, apart):
        return _final({name: 5.0 for name in ["fp32", "source", *(contender(i) for i in range(len(contenders)))]},
                      spread=0.03)

    out, pareto = _searched_with(tmp_path, monkeypatch, alike, budget=4, max_loss=0.5)
    plan = json.loads((out / "best" / "plan.json").read_text())
    unproven = pareto["not_shipped"]  # (--max-loss 0.5: an INT8 plan is within it, and all-INT8 is a trial)
    assert unproven is not None and unproven["trial"] != pareto["uniform"]["fp32"]
    assert unproven["beyond_timing_noise"] is False and unproven["low"] <= 1
    assert pareto["chosen"] == pareto["uniform"]["fp32"] == plan["trial"] and plan["plan"]["counts"]["int8"] == 0
    assert pareto["chosen"] in [t["trial"] for t in pareto["front"]]
    assert f"trial {unproven['trial']} was the fastest within the limit but is not faster than all-FP32" in \
        " ".join(capsys.readouterr().out.split())
    # why the timing ended there: the plan ran no faster (it stops), or its interval stayed wide (advice)
    said = "ran no faster in the final timing's" if unproven["speedup"] <= 1 else "could not narrow it"
    assert unproven["high"] / unproven["low"] - 1 <= 0.04 or said in unproven["why"]


def test_the_fastest_of_the_plans_the_retiming_cannot_tell_apart_in_the_final_rounds_is_shipped(
        tmp_path, monkeypatch, capsys):
    """Every reduced plan ties in the re-timing; in the final timing's rounds the first rival runs at 3 ms, the
    chosen plan at 5 and all-FP32 at 10: the rival is shipped, and the plan it beat is recorded as its rival."""
    asked = []

    def final(measurer, fp32, contenders, seconds, apart):
        asked.append(len(contenders))
        return _final({"fp32": 10.0, "source": 10.0, "chosen": 5.0,
                       **{contender(i): 2.0 + i for i in range(1, len(contenders))}})

    out, pareto = _searched_with(tmp_path, monkeypatch, final, budget=6, max_loss=1)
    assert asked and asked[0] > 1  # the chosen plan had rivals
    assert pareto["chosen_vs_fp32"]["speedup"] == pytest.approx(10 / 3, rel=0.03)
    rivals = pareto["final_rivals"]
    assert len(rivals) == asked[0] - 1 and pareto["chosen"] not in [r["trial"] for r in rivals]
    assert any(r["speedup"] == pytest.approx(2.0, rel=0.03) for r in rivals)  # the plan first chosen, at 5 ms
    assert json.loads((out / "best" / "plan.json").read_text())["trial"] == pareto["chosen"]
    assert pareto["chosen"] in [t["trial"] for t in pareto["front"]]
    printed = capsys.readouterr()
    said = " ".join((printed.out + printed.err).split())
    assert f"trial {pareto['chosen']} ran faster than trial" in said and "could not tell from it: trial" in said


def test_threads_are_the_engines_and_said_with_its_figures(tmp_path):
    model, data = conv_with_data(tmp_path, items=4)
    result = autoprec.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            engine=autoprec.EngineSpec(threads=1),
            study=autoprec.StudySpec(budget=2, warm_start=False),
            out=tmp_path / "out",
        )
    )
    assert "1 threads" in result.engine.device
    with pytest.raises(AutoprecError, match="--threads 2: sets ONNX Runtime's intra-op threads"):
        autoprec.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(model),
                engine=autoprec.EngineSpec(backend="tensorrt-rtx", threads=2),
                study=autoprec.StudySpec(budget=1),
                out=tmp_path / "trt",
            )
        )


def _one_matmul(folder, calibration_items: np.ndarray, evaluation_items: np.ndarray):
    """y = x·W, no bias, with ``data.npz`` whose calibration and evaluation batches are the given items."""
    from onnx import TensorProto, helper, numpy_helper

    from autoprec.analysis.data import build_dataset
    from autoprec.analysis.model_info import TensorSpec

    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.3, (16, 8)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], "fc")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    model = folder / "fc.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    count = len(calibration_items) + len(evaluation_items)
    data = folder / "data.npz"
    np.savez(data, x=np.arange(count, dtype=np.float32)[:, None].repeat(16, axis=1))  # which item lands where
    split = build_dataset(data, [TensorSpec("x", (1, 16), "float32")])
    calibrating = [int(batch["x"][0, 0]) for batch in split.calibration]
    items = np.empty((count, 16), np.float32)
    items[calibrating] = calibration_items
    items[[i for i in range(count) if i not in calibrating]] = evaluation_items
    np.savez(data, x=items)
    return model, data


def _searched_on(tmp_path, monkeypatch, calibration: np.ndarray, evaluation: np.ndarray) -> tuple[dict, dict]:
    """A one-MatMul model searched over INT8 and FP32 at --max-loss 0.01, the INT8 plan twice as fast as all-FP32
    in every timing: its pareto.json, and the all-INT8 trial's record."""

    def final(measurer, fp32, contenders, seconds, apart):
        return _final({"fp32": 10.0, "source": 10.0, **{contender(i): 5.0 for i in range(len(contenders))}})

    monkeypatch.setattr(InProcessMeasurer, "time_paired", _reduced_twice_as_fast)
    model, data = _one_matmul(tmp_path, calibration, evaluation)
    out = tmp_path / "out"
    assert main(["search", str(model), "--data", str(data), "--out", str(out), "--budget", "3", "--no-isolation",
                 "--no-progress", "--no-warm-start", "--max-loss", "0.01", "--precisions", "int8,fp32"],
                final_timing=final) == 0
    pareto = json.loads((out / "pareto.json").read_text())
    trials = json.loads((out / "trials.json").read_text())["trials"]
    return pareto, next(t for t in trials if t["trial"] == pareto["uniform"]["int8"])


def test_a_plan_within_the_limit_on_the_evaluation_batches_but_past_it_on_the_calibration_batches_is_not_chosen(
        tmp_path, monkeypatch, capsys):
    """The calibration items are tiny but for one as large as the evaluation items: INT8 ranges fit the large ones,
    so the all-INT8 plan is within the limit on the evaluation batches and turns the tiny items to zeros. It is
    not shipped though twice as fast; all-FP32 is, and the terminal says why."""
    rng = np.random.default_rng(1)
    calibration = rng.normal(0, 1e-3, (6, 16))
    calibration[0] = np.linspace(-250, 250, 16)  # the range of every evaluation item (five stds) and more
    pareto, int8 = _searched_on(tmp_path, monkeypatch, calibration, rng.normal(0, 50, (6, 16)))
    held = pareto["search"]["held_out"]
    judged = {j["trial"]: j["loss"] for j in held["judged"]}
    assert int8["accuracy_loss"] <= 0.01 < judged[int8["trial"]] and held["batches"] == 6
    assert pareto["chosen"] == pareto["uniform"]["fp32"]
    said = " ".join(capsys.readouterr().out.split())
    assert (f"within --max-loss 0.01 on the evaluation batches but not on the 6 calibration batches, which judged no "
            f"trial (ONNX Runtime CPU), so not chosen: trial {int8['trial']} (loss {judged[int8['trial']]:.3g})") in said


def test_a_plan_that_holds_the_limit_on_the_calibration_batches_is_shipped_with_its_loss_there(
        tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(1)
    calibration = rng.normal(0, 50, (6, 16))
    calibration[0] = np.linspace(-250, 250, 16)  # ranges that hold every evaluation item (five stds)
    pareto, int8 = _searched_on(tmp_path, monkeypatch, calibration, rng.normal(0, 50, (6, 16)))
    judged = {j["trial"]: j["loss"] for j in pareto["search"]["held_out"]["judged"]}
    assert pareto["chosen"] == int8["trial"] and 0 < judged[int8["trial"]] <= 0.01
    said = " ".join(capsys.readouterr().out.split())
    assert f"on the 6 calibration batches, which judged no trial (ONNX Runtime CPU): cosine loss " \
           f"{judged[int8['trial']]:.3g}" in said and "so not chosen" not in said


@pytest.mark.parametrize("blocks, per_block, enough", [(6, 1, False), (8, 1, True), (6, 2, True)])
def test_where_the_level_moved_each_half_of_the_interval_stands_on_enough_blocks(blocks, per_block, enough):
    """Where all-FP32's level moved, each half of the blocks gives an interval of its own: six blocks of one round
    (halves of three, t = 4.30) say too little to stop on; eight of one round, or six of two (a busy machine's
    blocks), do."""
    fp32, plan, block_of = _sessions(1.3, 0.01, 0, blocks=blocks, per_block=per_block)
    level = np.repeat([1.0, 1.3] * (blocks // 2), per_block)
    found = Rounds({"fp32": tuple(Timing(v, v, v, 10, 3) for v in np.multiply(fp32, level)),
                    "chosen": tuple(Timing(v, v, v, 10, 3) for v in np.multiply(plan, level))}, tuple(block_of))
    assert found.steadiness().moved
    assert bounded(found, [("fp32", "chosen")]) is enough


def test_a_call_as_slow_as_a_runs_share_of_the_timing_is_timed_from_its_first_run():
    """A turn of a 160 ms model (ppocr-det at 640x640 on this VM) was four runs for three timed: a call that
    takes min_seconds / min_runs or more is timed from its first run (its session ran before); a faster one is
    warmed up first, its warm-up runs out of the figures."""
    import time

    from autoprec.core.timing import Runs, time_calls

    took = []

    def call(seconds):
        took.append(seconds)
        time.sleep(seconds)

    slow = time_calls(lambda: call(0.07), Runs(warmup=3))
    assert (slow.warmup, slow.runs, len(took)) == (0, 3, 3)
    took.clear()
    fast = time_calls(lambda: call(0.001), Runs(warmup=3))
    assert fast.warmup == 3 and len(took) == fast.runs + 3 and fast.runs > 3


def test_the_retiming_and_the_final_timing_warm_a_session_once_a_turn_as_it_was_warmed_when_built(tmp_path):
    """A session of those stages ran once when it was built: each turn warms it with one run, where a
    trial's one timing takes three."""
    import builders

    from autoprec.analysis.model import analyse
    from autoprec.backends import get_backend
    from autoprec.core.search_space import load_search_space
    from autoprec.measure.measurement import time_paired

    backend = get_backend("ort-cpu", threads=1)
    stored = analyse(builders.save(builders.conv_net(), tmp_path / "conv.onnx"),
                     load_search_space()).stored
    batch = {"x": np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)}
    with backend.runner(stored) as runner:
        trial = runner.time(batch)
    paired = time_paired(backend, stored, stored, Workload.of(batch), rounds=2)
    final = time_until_known(backend, {"fp32": stored, "chosen": stored}, Workload.of(batch), [("fp32", "chosen")], 0)
    turns = [*paired.reference, *paired.candidate, *final.timings["fp32"], *final.timings["chosen"]]
    assert trial.warmup == 3 and {turn.warmup for turn in turns} == {1}


def test_the_final_timing_times_the_files_a_user_deploys_not_their_fixed_shape_twins(tmp_path, monkeypatch):
    """A model with a dynamic batch: its plans are searched at the data's shape, but the speed-ups stated are the
    shipped best/model.onnx's and the given file's as they are (their batch dim kept), which ONNX Runtime runs
    otherwise than graphs whose every shape is known (magika's INT8 plan 6 % faster fixed, its FP32 file 1 %)."""
    timed = []

    def recording(backend, models, *args, **kwargs):
        timed.append({name: model.proto for name, model in models.items()})
        return time_until_known(backend, models, *args, **kwargs)

    monkeypatch.setattr(measurement, "time_until_known", recording)
    monkeypatch.setattr(InProcessMeasurer, "time_paired", _reduced_twice_as_fast)  # a reduced plan is chosen
    model, data = conv_with_data(tmp_path, items=12, batch="N")
    out = tmp_path / "out"
    autoprec.search(autoprec.SearchConfig(  # every plan within the limit: the fastest, a reduced one, is chosen
        autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec(max_loss=0.5),
        study=autoprec.StudySpec(budget=6, seed=0, warm_start=False), out=out,
        retime_seconds=1, ship_within_noise=True, isolation=autoprec.IsolationSpec(isolate=False)))
    pareto = json.loads((out / "pareto.json").read_text())
    assert len(timed) == (pareto["final_timing"] is not None) == 1, "this search must reach its final timing"

    def batch_dims(graph: onnx.ModelProto) -> list[str]:
        return [value.type.tensor_type.shape.dim[0].dim_param for value in graph.graph.input]

    assert all(batch_dims(graph) == ["N"] for graph in timed[0].values())
    given, shipped = onnx.load(model), onnx.load(out / "best" / "model.onnx", load_external_data=False)
    assert [n.op_type for n in timed[0]["source"].graph.node] == [n.op_type for n in given.graph.node]
    assert any([n.name for n in graph.graph.node] == [n.name for n in shipped.graph.node]
               for name, graph in timed[0].items() if name not in ("fp32", "source"))


@pytest.mark.parametrize("sums", [int8_sums.EXACT, int8_sums.PAIRS])
def test_a_shipped_int8_plan_says_how_the_cpu_that_judged_it_sums_int8_products(tmp_path, monkeypatch, capsys, sums):
    """ONNX Runtime's INT8 kernels sum products exactly on VNNI, AMX and Arm, in saturating int16 pairs on x86 without
    VNNI (a Conv's INT8 loss 6.7e-8 against 1.31e-5): the result records which this CPU does, and a shipped INT8 plan
    judged on an exact one warns that a deployment on the other kind needs judging there."""
    monkeypatch.setattr(onnxruntime_backend, "int8_sums", lambda: sums)
    monkeypatch.setattr(InProcessMeasurer, "time_paired", _reduced_twice_as_fast)
    model, data = conv_with_data(tmp_path, items=12)
    out = tmp_path / "out"
    assert main(["search", str(model), "--data", str(data), "--out", str(out), "--budget", "4", "--no-isolation",
                 "--no-progress", "--no-warm-start", "--max-loss", "0.5", "--precisions", "int8,fp32",
                 "--ship-within-noise", "--retime-seconds", "0.1"]) == 0
    pareto, plan = (json.loads((out / name).read_text()) for name in ("pareto.json", "best/plan.json"))
    assert pareto["engine"]["versions"]["int8_sums"] == sums and plan["plan"]["counts"]["int8"] > 0
    said = " ".join(capsys.readouterr().out.split())
    warned = "INT8 losses were judged on a CPU that sums INT8 products in int32"
    assert (warned in said and "x86 CPU without VNNI sums pairs in int16" in said) == (sums == int8_sums.EXACT)
    assert ("INT8 losses were judged on a CPU that sums INT8 products in int16 pairs" in said) == (sums == int8_sums.PAIRS)
