"""experiments/tables.py: the results tables of README.md and docs/ are what the committed result files say."""

from __future__ import annotations

import pytest
from conftest import load_experiment


@pytest.fixture(scope="module")
def tables():
    return load_experiment("tables")


def test_documents_match_the_result_files(tables):
    diffs = tables.check()
    assert not diffs, "a table differs from its result files; run python experiments/tables.py\n" + "".join(diffs)


def test_every_table_is_placed_once(tables):
    placed = []
    for path in tables.DOCUMENTS:
        placed += [match.group("name") for match in tables.MARKED.finditer(path.read_text())]
    assert sorted(placed) == sorted(tables.TABLES), "each table in TABLES sits between one pair of markers"


def test_check_reports_a_hand_edited_number(tables, tmp_path):
    readme = tmp_path / "README.md"
    text = tables.DOCUMENTS[0].read_text()
    assert "29.04 ± 2.09" in text  # CoLA, FAR's automatic configuration, grouped.json's mean ± std
    readme.write_text(text.replace("29.04 ± 2.09", "29.05 ± 2.08", 1))
    (diff,) = tables.check([readme])
    assert "-| FAR's automatic" in diff and "29.04 ± 2.09" in diff


def test_a_table_names_its_files_machine_and_command(tables):
    written = tables.TABLES["grouped"]()
    assert "Files: `experiments/results/replicate_far/grouped/grouped.json`" in written
    assert "Machine: AMD EPYC, 2 cores" in written
    assert "Command: `python experiments/replicate_far.py " in written
    # a one-seed row says so, and every row compares with full's mean over its seeds (SST-2: 84.29 - 84.02)
    assert "| FAR auto, K=2 (`AUTO_FREEZE_MASS` 0.4) | 1 | 84.29 | +0.27 | 77 | 0.76 |" in written


def test_an_unknown_marker_is_refused(tables):
    with pytest.raises(SystemExit, match="unknown table 'nope'"):
        tables.rewrite("<!-- table:nope -->\n<!-- /table:nope -->")
