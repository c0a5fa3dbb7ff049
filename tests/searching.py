"""The search as the tests run it: ``autoprec.search`` and the command line without the final timing
(:func:`autoprec.study.choice.not_timed`), which the tests that are not about it leave out (>= 3 blocks of
interleaved rounds of three models, up to --retime-seconds: with it in every search the suite would not stay under
10 minutes). A search without it states its speed-up from the re-timing's rounds, as where the final timing fails.
The tests about the final timing call ``autoprec.search`` and ``autoprec.app.cli.main`` themselves, with the real
one or a fake of their own. A search in a process of its own (the command line as users run it) cannot be given
``not_timed``: those not about the final timing run its shortest, ``SHORTEST_FINAL_TIMING`` (its three blocks)."""

import autoprec
from autoprec.app.cli import main as cli_main
from autoprec.study.choice import not_timed

SHORTEST_FINAL_TIMING = ("--retime-seconds", "0.1")


def search(config):
    return autoprec.search(config, final_timing=not_timed)


def main(argv=None) -> int:
    return cli_main(argv, final_timing=not_timed)
