"""The progress bar: whole lines at most once per interval off a terminal, tqdm's in-place bar on one, process 0
only."""

import io

import jax
import pytest

from rrc_jax.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    """A fake `time.time` for tqdm, one second later at each call to `tick`."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def tick(self):
        self.now += 1.0


def lines(stream):
    text = stream.getvalue()
    assert "\r" not in text and text.endswith("\n")
    return text.splitlines()


def test_off_a_terminal_one_line_per_interval_and_a_last_one(monkeypatch):
    """100 one-second steps with a 30 s interval: the first line, one every 30 s, and the last one (not twice)."""
    clock = Clock()
    monkeypatch.setattr("tqdm.std.time", clock)
    stream = io.StringIO()
    with Progress(100, "train", interval=30, stream=stream) as bar:
        for _ in range(100):
            clock.tick()
            bar.update(1, reward=1 / 3)
    out = lines(stream)
    assert [line.split("|")[2].split()[0] for line in out] == ["0/100", "30/100", "60/100", "90/100", "100/100"]
    assert out[-1].startswith("train: 100%") and "reward=0.3333" in out[-1]


def test_many_fast_updates_are_two_lines(monkeypatch):
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    stream = io.StringIO()
    with Progress(1000, "anchors", start=10, stream=stream) as bar:  # the default interval, 30 s
        for _ in range(990):
            bar.update(1, loss=0.123456)
    first, last = lines(stream)
    assert " 10/1000 " in first and " 1000/1000 " in last and "loss=0.1235" in last


def test_the_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv("TQDM_MININTERVAL", "0")
    stream = io.StringIO()
    with Progress(5, "x", stream=stream) as bar:
        for _ in range(5):
            bar.update(1)
    assert len(lines(stream)) == 6


def test_a_terminal_gets_the_bar_redrawn_in_place():
    stream = Terminal()
    with Progress(3, "x", interval=0, stream=stream) as bar:
        for _ in range(3):
            bar.update(1)
    assert stream.getvalue().count("\r") >= 3 and stream.getvalue().count("\n") == 1


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal])
def test_only_process_0_draws(monkeypatch, stream_type):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    stream = stream_type()
    with Progress(3, "x", interval=0, stream=stream) as bar:
        bar.update(3, loss=1.0)
    assert stream.getvalue() == ""
