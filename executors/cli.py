"""The ``rankcore`` console script.

``rankcore demo`` walks the core through upscale, crash, downscale and
recovery; ``rankcore diagram`` renders the replica lifecycle from its single
declaration (mermaid text always; PNG when graphviz's ``dot`` is installed).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click
from rich.console import Console


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rankcore")
def main() -> None:
    """rankcore: stable, contiguous replica ranks."""


@main.command()
def demo() -> None:
    """Print ranks through upscale, crash, downscale and controller recovery."""
    from .demo import run_demo

    run_demo(Console())


@main.command()
@click.option("--format", "fmt", type=click.Choice(["mermaid", "png"]), default="mermaid", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
def diagram(fmt: str, output: Path | None) -> None:
    """Render the replica lifecycle (generated from rankcore.lifecycle.DECLARATION)."""
    from rankcore import lifecycle

    if fmt == "mermaid":
        text = lifecycle.mermaid()
        if output:
            output.write_text(text + "\n")
            click.echo(f"wrote {output}")
        else:
            click.echo(text)
        return
    if shutil.which("dot") is None:
        raise click.ClickException(
            "PNG needs graphviz's 'dot' binary (e.g. apt-get install graphviz) and the "
            "'graphviz' Python package; '--format mermaid' needs neither"
        )
    try:
        graph = lifecycle.graph_machine("graphviz")
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise click.ClickException(f"PNG needs the 'graphviz' Python package: {exc}") from None
    target = output or Path("lifecycle.png")
    graph.draw(str(target), prog="dot", format="png")
    click.echo(f"wrote {target}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
