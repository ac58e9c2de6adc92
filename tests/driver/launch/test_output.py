"""Output forwarding through real pipes: prefixes per line, partial lines, binary junk,
long lines, whole-line writes under concurrency, and failures that must not stop a pump."""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
import time

import pytest

from driver.launch.output import MAX_LINE, OutputForwarder, format_line, worker_prefix, write_line
from tests.support.jobs import wait_until

wait_for = wait_until  # one polling helper for every test


class Pipes:
    """A stdout and a stderr pipe pair, as a worker's would be; the test writes."""

    def __init__(self):
        r1, self.w_out = os.pipe()
        r2, self.w_err = os.pipe()
        self.r_out = os.fdopen(r1, "rb")
        self.r_err = os.fdopen(r2, "rb")

    def write(self, data: bytes, err: bool = False) -> None:
        os.write(self.w_err if err else self.w_out, data)

    def close(self) -> None:
        for fd in (self.w_out, self.w_err):
            with contextlib.suppress(OSError):
                os.close(fd)


@pytest.fixture
def pipes():
    p = Pipes()
    yield p
    p.close()


def start(pipes, prefix_fn, out, err, **kw) -> OutputForwarder:
    fw = OutputForwarder(prefix_fn, out, err, **kw)
    fw.start(pipes.r_out, pipes.r_err)
    return fw


def test_pure_helpers():
    assert worker_prefix(None, "host:0") == "[host:0]"
    assert worker_prefix(0, "host:0") == "[0]"
    assert format_line("[1]", b"abc\n") == b"[1] abc\n"
    assert format_line("[1]", b"abc") == b"[1] abc\n"  # a partial line gets its newline
    assert format_line("[\u00e9]", b"\xff\n") == "[\u00e9] ".encode() + b"\xff\n"


def test_prefix_changes_mid_stream_and_streams_stay_apart(pipes):
    out, err = io.BytesIO(), io.BytesIO()
    rank: list[int | None] = [None]
    fw = start(pipes, lambda: worker_prefix(rank[0], "n1:2"), out, err)
    pipes.write(b"first\n")
    pipes.write(b"warning\n", err=True)
    wait_for(lambda: out.getvalue() and err.getvalue(), 5, "the first lines")
    rank[0] = 4
    pipes.write(b"second\nthird\n")
    pipes.close()
    assert fw.join(5)
    assert out.getvalue() == b"[n1:2] first\n[4] second\n[4] third\n"
    assert err.getvalue() == b"[n1:2] warning\n"


def test_partial_last_line_and_binary_junk(pipes):
    out = io.BytesIO()
    text = io.StringIO()  # a text-only destination must not choke on bad UTF-8
    fw = start(pipes, lambda: "[0]", out, text)
    pipes.write(b"\x00\xff\xfebin\x80ary\n")
    pipes.write(b"no newline at the end")
    pipes.write(b"\xc3\x28 junk \xff", err=True)
    pipes.close()
    assert fw.join(5)
    assert out.getvalue() == b"[0] \x00\xff\xfebin\x80ary\n[0] no newline at the end\n"
    assert text.getvalue() == "[0] \ufffd( junk \ufffd\n"


def test_long_lines_are_split(pipes):
    out = io.BytesIO()
    fw = start(pipes, lambda: "[0]", out, io.BytesIO())
    done = threading.Thread(
        target=lambda: (pipes.write(b"x" * (MAX_LINE + 10) + b"\n"), pipes.close()), daemon=True
    )
    done.start()
    done.join(10)
    assert fw.join(5)
    lines = out.getvalue().split(b"\n")
    assert lines[0] == b"[0] " + b"x" * MAX_LINE
    assert lines[1] == b"[0] " + b"x" * 10
    assert lines[2] == b""


class SlowTextStream(io.TextIOBase):
    """Writes one character at a time and yields the GIL between them: without the
    forwarder's lock, concurrent lines would interleave inside a line."""

    def __init__(self):
        self.chars: list[str] = []

    def writable(self):
        return True

    def write(self, s):
        for c in s:
            self.chars.append(c)
            time.sleep(0)  # yield the GIL mid-write: the interleaving is what is under test
        return len(s)

    def getvalue(self) -> str:
        return "".join(self.chars)


def test_lines_of_different_workers_never_interleave():
    out = SlowTextStream()
    workers = [Pipes() for _ in range(4)]
    try:
        forwarders = [
            start(p, (lambda i=i: f"[{i}]"), out, io.BytesIO()) for i, p in enumerate(workers)
        ]

        def produce(i, p):
            for n in range(50):
                p.write(f"worker {i} line {n} {'z' * 40}\n".encode())
            p.close()

        threads = [
            threading.Thread(target=produce, args=(i, p), daemon=True)
            for i, p in enumerate(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for fw in forwarders:
            assert fw.join(10)
    finally:
        for p in workers:
            p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 200
    pattern = re.compile(r"\[(\d)\] worker \1 line \d+ z{40}\Z")
    assert all(pattern.match(line) for line in lines), lines[:5]
    for i in range(4):  # each worker's lines keep their order
        mine = [int(line.split()[4]) for line in lines if line.startswith(f"[{i}]")]
        assert mine == list(range(50))


def test_failing_prefix_and_broken_destination_keep_draining(pipes):
    class Broken(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise BrokenPipeError("reader went away")

    def bad_prefix():
        raise RuntimeError("no rank yet")

    err = io.BytesIO()
    fw = start(pipes, bad_prefix, Broken(), err, name="w7")

    def produce():
        # 1 MiB is far more than a pipe holds: the writer only finishes if the pump drains.
        for _ in range(1024):
            pipes.write(b"y" * 1023 + b"\n")
        pipes.write(b"still here\n", err=True)
        pipes.close()

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "the pump stopped draining a broken destination"
    assert fw.join(5)
    assert err.getvalue() == b"[w7] still here\n"


def test_log_file_gets_unprefixed_lines(pipes, tmp_path):
    log = tmp_path / "worker-0.log"
    fw = start(pipes, lambda: "[0]", io.BytesIO(), io.BytesIO(), log_path=str(log))
    pipes.write(b"out line\n")
    pipes.write(b"err line", err=True)
    pipes.close()
    assert fw.join(5)
    assert sorted(log.read_bytes().splitlines()) == [b"err line", b"out line"]


def test_default_destinations_are_the_drivers_streams(pipes, capsys):
    print("driver says hi")  # text written before must stay before the forwarded bytes
    fw = start(pipes, lambda: "[2]", None, None)
    pipes.write(b"hello\n")
    pipes.write(b"oops\n", err=True)
    pipes.close()
    assert fw.join(5)
    captured = capsys.readouterr()
    assert captured.out == "driver says hi\n[2] hello\n"
    assert captured.err == "[2] oops\n"


def test_write_line_to_a_text_stream_with_buffer():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8")
    stream.write("text first\n")
    write_line(stream, b"[0] bytes after\n")
    assert raw.getvalue() == b"text first\n[0] bytes after\n"
