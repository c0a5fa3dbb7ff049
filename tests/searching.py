"""The search as the tests run it: ``autoprec.search`` and the command line without the final timing
(:func:`autoprec.study.choice.not_timed`) and without the figures (``--no-plots``), which the tests that are not
about them leave out (the final timing: >= 3 blocks of interleaved rounds of three models, up to --retime-seconds;
the figures: about a second of every search's CPU, a sixth of the suite's; with both in every search the suite would
not stay under 10 minutes). A search without the final timing states its speed-up from the re-timing's rounds, as
where the final timing fails. The tests about the final timing or the figures call ``autoprec.search`` and
``autoprec.app.cli.main`` themselves, with the real timing or a fake of their own. A search in a process of its own
(the command line as users run it) cannot be given ``not_timed``: those not about the final timing run its shortest,
``SHORTEST_FINAL_TIMING`` (its three blocks)."""

import dataclasses

import autoprec
from autoprec.app.cli import main as cli_main
from autoprec.study.choice import not_timed

SHORTEST_FINAL_TIMING = ("--retime-seconds", "0.1")


def search(config, plots: bool = False):
    return autoprec.search(dataclasses.replace(config, plots=plots), final_timing=not_timed)


def main(argv) -> int:
    argv = [str(a) for a in argv]
    return cli_main([*argv, "--no-plots"] if argv[:1] == ["search"] else argv, final_timing=not_timed)
