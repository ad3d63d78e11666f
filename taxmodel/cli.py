"""The `taxmodel` command line: argument handling and printing only; the work lives in the library.

Every command turns a TaxmodelError into one line on stderr and its exit code (2 for bad
input), so scripts and CI can tell bad input from a regression (exit 1).
"""
from __future__ import annotations

import sys

import click

from taxmodel import __version__
from taxmodel.errors import TaxmodelError


class _Group(click.Group):
    """A click group that reports TaxmodelError as one clear line instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TaxmodelError as exc:
            click.echo(f"taxmodel: error: {exc}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="taxmodel")
def cli() -> None:
    """Where the time of multi-GPU kernels goes: the Three Taxes, measured and predicted.

    \b
    Typical session:
      taxmodel profile ag_gemm --world-size 4 -o runs/   # run + trace every variant
      taxmodel analyze runs/ag_gemm/*                     # split time into the taxes
      taxmodel report runs/ag_gemm/* -o report.html       # figures and headline
    Bring your own traces:
      taxmodel import rank*.json.gz -o my_bundle          # torch.profiler / nsys / rocprof
      taxmodel analyze my_bundle
    """


# --- trace: import, show -------------------------------------------------------------------

# --- runtime: profile, workloads -----------------------------------------------------------

# --- model: analyze, calibrate, predict, validate ------------------------------------------

# --- report: report, export-trace ----------------------------------------------------------

# --- regress: compare, baseline ------------------------------------------------------------


def main() -> None:
    cli(prog_name="taxmodel")


if __name__ == "__main__":
    main()
