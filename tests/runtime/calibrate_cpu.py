"""`taxmodel calibrate` on CPU ranks for the fault tests: ``python calibrate_cpu.py -o OUT --update
FILE [--timeout S] [--sizes B,B]``. The command has no --device option (it measures GPUs), so this
adds a ``calibrate-cpu`` command to the real CLI group, which then handles its errors and signals
exactly as it does for ``taxmodel calibrate`` (one line, exit 2/3, 128 + the signal); the run
goes through ``run_calibration`` with ``device="cpu"``: the collectives step on gloo ranks."""
from __future__ import annotations

import click

from taxmodel.cli import cli


@cli.command("calibrate-cpu")
@click.option("-o", "--output", required=True)
@click.option("--update", required=True)
@click.option("--timeout", "timeout_s", type=float, default=120.0)
@click.option("--sizes", default="8192")
def calibrate_cpu(output, update, timeout_s, sizes) -> None:
    from taxmodel.runtime.calibrate import run_calibration

    spec = run_calibration(output, world_size=2, timeout_s=timeout_s, only="collectives", update=update, sizes=sizes,
                           device="cpu")
    click.echo(f"wrote {output}: {spec.label}")


if __name__ == "__main__":
    cli(prog_name="taxmodel")
