"""The search as the tests run it: ``autoprec.search`` and the command line without the final timing, which is left
out of the tests that are not about it (>= 6 blocks of interleaved rounds of three models, up to
--retime-seconds: with it in every search the suite would not stay under 10 minutes). A search without it states
its speed-up as where the final timing fails: from the re-timing's rounds. The tests about the final timing call
``autoprec.search`` and ``autoprec.app.cli.main`` themselves."""

import autoprec
from autoprec.app.cli import main as cli_main


def search(config):
    return autoprec.search(config)


def main(argv=None) -> int:
    return cli_main(argv)
