"""docs/options.md is what host_tools.docgen writes from the argparse definitions, and it
names every option of every subcommand."""
import argparse
import os

from host_tools import docgen
from host_tools.cli import parser


def test_options_md_is_current():
    with open(docgen.OUT) as f:
        assert f.read() == docgen.render(), \
            'docs/options.md is stale: run python -m host_tools.docgen'


def test_every_option_has_a_row_and_a_help_text():
    text = docgen.render()
    sub = next(a for a in parser('utrain')._actions if isinstance(a, argparse._SubParsersAction))
    for name, q in sub.choices.items():
        assert f'## {name}' in text
        for act in q._actions:
            if isinstance(act, argparse._HelpAction):
                continue
            for opt in act.option_strings:
                assert f'`{opt}`' in text, (name, opt)
            assert act.help, f'{name} {act.dest}: no help text (docs/options.md needs one)'


def test_check_mode_spots_a_stale_file(tmp_path):
    stale = tmp_path / 'options.md'
    stale.write_text('old')
    assert docgen.main(['--check', '-o', str(stale)]) == 1
    assert docgen.main(['-o', str(stale)]) == 0
    assert docgen.main(['--check', '-o', str(stale)]) == 0
    assert os.path.getsize(stale) > 1000
