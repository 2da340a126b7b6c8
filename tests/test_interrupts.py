"""A Ctrl-C that lands where Python cannot raise it (a weakref callback, a ``__del__``) still stops the run:
at the next progress-bar step, before anything is published, or when the command returns."""

from __future__ import annotations

import signal
import sys

import pytest

from apd.cli import main
from apd.interrupts import interrupted, noting_interrupts, raise_if_interrupted
from apd.pipeline.stage import publish
from apd.samplers.store import SampleStore
from tests.tiny_pipeline import tiny_context, toml


class _CtrlCWhileCollected:
    """Ctrl-C arrives while this object is being collected, where the interpreter swallows it."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


class _FailsWhileCollected:
    def __del__(self):
        raise ValueError("not an interrupt")


def _swallowed_ctrl_c() -> None:
    obj = _CtrlCWhileCollected()
    del obj  # the KeyboardInterrupt raised in __del__ does not reach this frame


def test_a_swallowed_ctrl_c_is_noted_silently_and_raised_at_the_next_safe_point(capsys):
    before = signal.getsignal(signal.SIGINT)  # Python's handler, or SIG_IGN under `nohup`/`&`
    with noting_interrupts():
        _swallowed_ctrl_c()
        assert interrupted()
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted()
    assert capsys.readouterr().err == ""  # no "Exception ignored in ..." traceback
    assert not interrupted()
    raise_if_interrupted()  # outside the block nothing is pending
    assert signal.getsignal(signal.SIGINT) is before  # the handler the block found is back


def test_a_plain_ctrl_c_raises_at_once():
    with noting_interrupts(), pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_other_exceptions_in_a_destructor_still_reach_the_unraisable_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))
    with noting_interrupts():
        obj = _FailsWhileCollected()
        del obj
        _swallowed_ctrl_c()
    assert seen == [ValueError]


def test_progress_bars_and_publication_stop_after_a_swallowed_ctrl_c(tmp_path):
    ctx = tiny_context(tmp_path)
    built, final = tmp_path / "w.partial", tmp_path / "w.pt"
    built.write_bytes(b"weights")
    with noting_interrupts():
        _swallowed_ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            list(ctx.progress(range(3)))
        with pytest.raises(KeyboardInterrupt):
            ctx.progress(total=3).update()
        with pytest.raises(KeyboardInterrupt):
            publish({built: final}, tmp_path / "w.json", {"stage": "test"})
    assert built.read_bytes() == b"weights"
    assert not final.exists() and not (tmp_path / "w.json").exists()
    assert list(ctx.progress(range(3))) == [0, 1, 2]


@pytest.mark.parametrize("force", [False, True])
def test_the_cli_exits_130_and_publishes_nothing_after_a_swallowed_ctrl_c(tmp_path, monkeypatch, capsys, force):
    config = tmp_path / "c.toml"
    config.write_text(toml({"name": "c", "data": {"train_size": 500, "val_size": 200}, "net": {"hidden": [8]},
                            "sgld": {"iterations": 200, "burn_in": 50, "thin": 10, "checkpoint_every": 100}}))
    real_append, calls = SampleStore.append_many, []

    def append_while_ctrl_c_is_swallowed(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            _swallowed_ctrl_c()
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(SampleStore, "append_many", append_while_ctrl_c_is_swallowed)
    code = main(["sample", "--config", str(config), "--artifacts", str(tmp_path / "artifacts"), "--quiet",
                 *(["--force"] if force else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130
    assert err == ["apd sample: interrupted; " + ("the same command without --force resumes it (or, where the stage "
                                                  "was complete, keeps that; --force starts over)" if force else
                                                  "run the same command again to resume")]
    assert len(calls) == 3  # it stopped at the next iteration, not at the end of the chain
    assert not (tmp_path / "artifacts" / "c" / "samples.h5").exists()
    assert not (tmp_path / "artifacts" / "c" / "samples.json").exists()
