"""The command line's own help: every subcommand describes itself and shows its defaults."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from apd.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_help_has_a_description_and_shows_defaults(name):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        build_parser().parse_args([name, "--help"])
    assert done.value.code == 0
    description = out.getvalue().split("\n\n")[1]
    assert not description.startswith(("options:", "positional arguments:")) and len(description) > 20
    assert "(default: digits)" in out.getvalue() and "(default: artifacts)" in out.getvalue()
