"""Where the command line finds its data: --data-dir, $FAR_DATA_DIR, ../shared/data; and what it says without any."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import far.data.locate as locate
from far.cli.main import main
from far.data.locate import locate_data_dir


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """The current folder is a clone with ../shared/data beside it; no $FAR_DATA_DIR, the hub offline."""
    root = tmp_path / "far"
    root.mkdir()
    (tmp_path / "shared" / "data" / "glue" / "CoLA").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.delenv("FAR_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


@pytest.fixture
def no_default(clone, monkeypatch):
    """As a clone with no ../shared/data beside it (nor beside the checkout these tests run from)."""
    monkeypatch.setattr(locate, "DEFAULT_DATA_DIR", Path("no-such-folder/data"))


def test_the_order_is_data_dir_then_env_then_shared_data(clone, tmp_path, monkeypatch, caplog):
    shared = (tmp_path / "shared" / "data").resolve()
    with caplog.at_level(logging.INFO, logger="far.data.locate"):
        assert locate_data_dir() == shared
    assert f"data: {shared} (the default ../shared/data" in caplog.text
    (tmp_path / "env").mkdir()
    monkeypatch.setenv("FAR_DATA_DIR", str(tmp_path / "env"))
    assert locate_data_dir() == tmp_path / "env"
    assert locate_data_dir(clone) == clone


def test_a_default_folder_without_glue_or_squad_is_not_used(clone, tmp_path, no_default):
    with pytest.raises(FileNotFoundError, match="no local data"):
        locate_data_dir()


def test_without_data_offline_the_message_says_what_to_pass(no_default, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)  # CI sets both; the message names what is set
    with pytest.raises(FileNotFoundError) as e:
        locate_data_dir(needs="squad/dev-v1.1.json")
    message = str(e.value)
    for part in (
        "--data-dir not given, $FAR_DATA_DIR unset",
        "no-such-folder/data",
        "the hub is offline (HF_HUB_OFFLINE set)",
        "pass --data-dir DIR or export FAR_DATA_DIR=DIR, where DIR holds squad/dev-v1.1.json",
    ):
        assert part in message, message


def test_without_data_online_the_hub_is_tried_with_a_warning(no_default, monkeypatch, caplog):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with caplog.at_level(logging.WARNING, logger="far.data.locate"):
        assert locate_data_dir() is None
    assert (
        "trying the Hugging Face hub (without a network, pass --data-dir DIR or export FAR_DATA_DIR=DIR" in caplog.text
    )
    with pytest.raises(FileNotFoundError, match="this command reads local files only. To fix: pass --data-dir DIR"):
        locate_data_dir(hub=False)


def test_a_missing_named_folder_is_still_an_error(clone, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"nope \(from --data-dir\) does not exist"):
        locate_data_dir(clone / "nope")
    monkeypatch.setenv("FAR_DATA_DIR", str(clone / "gone"))
    with pytest.raises(FileNotFoundError, match=r"gone \(from \$FAR_DATA_DIR\) does not exist"):
        locate_data_dir()


@pytest.mark.parametrize(
    "argv,needs",
    [
        (["glue", "--task", "cola"], "glue/<Task>/train.tsv and dev.tsv"),
        (["glue", "--task", "sst2", "--model", "smollm2-135m", "--optimizer", "mezo"], "reads local files only"),
        (["squad"], "where DIR holds squad/dev-v1.1.json"),
        (["squad", "--version", "2.0"], "where DIR holds squad/dev-v2.0.json"),
        (["demo"], "where DIR holds glue/SST-2/train.tsv and dev.tsv"),
        # The data are checked before the checkpoint is read: no model loads.
        (["eval", "--checkpoint", "no-such-model"], "or squad/dev-v1.1.json"),
    ],
)
def test_commands_without_data_stop_first_saying_what_to_pass(no_default, argv, needs, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"far {argv[0]}: error: no local data: --data-dir not given"), err
    assert "pass --data-dir DIR or export FAR_DATA_DIR=DIR" in err and needs in err, err
