"""Bad options and arguments of ``scrapy parse_page``, ``scrapy demo`` and the integer options of every command:
refused by name before any work starts.

Run as a person runs them (``scrapy ...`` subprocesses); none of them reaches a service.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from conftest import run_scrapy

from product_crawl.commands.cluster import max_proc
from product_crawl.services import integer, tcp_port

PAGE = str(Path(__file__).parent / "pages" / "baidu_2021.html")


@pytest.mark.parametrize("url", ["http://[::1", "notaurl", "ftp://x/", "", "http://x:99999/", "http:///path"])
def test_parse_page_refuses_a_url_that_is_not_absolute_http(url: str) -> None:
    done = run_scrapy(["parse_page", PAGE, f"--url={url}"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--url: expected an absolute http(s) URL with a host, got {url!r}" in done.stderr


@pytest.mark.parametrize("encoding", ["nope", "base64"])
def test_parse_page_refuses_an_unknown_encoding(encoding: str) -> None:
    done = run_scrapy(["parse_page", PAGE, "--encoding", encoding])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--encoding: expected a text encoding such as gbk or utf-8, got {encoding!r}" in done.stderr


def test_parse_page_names_an_empty_file_argument_as_given() -> None:
    done = run_scrapy(["parse_page", ""])
    assert done.returncode == 2
    assert "FILE '': expected the path of a saved result page" in done.stderr


def test_parse_page_reads_a_page_number_out_of_range_as_a_malformed_one() -> None:
    """``pn=99999999999999999999999`` gave ranks of about 1e23; past MAX_PAGE pages the page number reads as a
    malformed one does (``pn=abc``: ranks from the page's own numbering)."""
    ranks = []
    for pn in ("abc", "99999999999999999999999"):
        done = run_scrapy(["parse_page", PAGE, f"--url=https://www.baidu.com/s?wd=x&pn={pn}"])
        assert done.returncode == 0, done.stderr
        ranks.append([r["rank"] for r in json.loads(done.stdout)["results"]])
    assert ranks[0] and ranks[1] == ranks[0] and max(ranks[0]) < 100


@pytest.mark.parametrize("duration", ["nan", "inf", "1e308", "5"])
def test_demo_refuses_a_duration_out_of_range(duration: str) -> None:
    # Services on closed ports: had the check let the value through, the demo would fail on Redis, not start.
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:1/0", MONGO_URI="mongodb://127.0.0.1:1/")
    done = run_scrapy(["demo", f"--duration={duration}"], env)
    assert done.returncode == 2
    assert f"--duration: expected 10 .. 86400 seconds, got {float(duration):g}" in done.stderr
    assert "redis" not in done.stderr


@pytest.mark.parametrize("port", ["-5", "99999999"])
def test_demo_refuses_a_dashboard_port_out_of_range(port: str) -> None:
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:1/0", MONGO_URI="mongodb://127.0.0.1:1/")
    done = run_scrapy(["demo", f"--dashboard-port={port}"], env)
    assert done.returncode == 2 and "redis" not in done.stderr
    assert f"argument --dashboard-port: expected a TCP port 0 .. 65535 (0 picks a free one), got {port!r}" \
        in done.stderr


# Digits of other scripts (Arabic-Indic, full-width) that int() reads as numbers, one (superscript) that
# str.isdigit takes but int() refuses, and what else int() reads: an integer option reads ASCII digits only.
OTHER_DIGITS = ["١", "１", "²", "1_0", "+1"]


def test_integer_options_read_ascii_digits_only() -> None:
    for value in OTHER_DIGITS:
        for parse, expected in ((integer, "a whole number (ASCII digits)"),
                                (max_proc, "a whole number of jobs >= 1"),
                                (tcp_port, "a TCP port 0 .. 65535 (0 picks a free one)")):
            with pytest.raises(argparse.ArgumentTypeError) as info:
                parse(value)
            assert str(info.value) == f"expected {expected}, got {value!r}"
    assert (integer(" 7 "), max_proc("16"), tcp_port("0")) == (7, 16, 0)  # what they accepted before, still


def test_split_type_reads_ascii_digits_only() -> None:
    for value in ("١", "１", "²"):
        done = run_scrapy(["split", "牛奶", "--site", "a.com", "--type", value])
        assert done.returncode == 2 and "Traceback" not in done.stderr and not done.stdout, value
        assert f"--type: expected 0 or 1, got {value!r}" in done.stderr


@pytest.mark.parametrize("command", [["experiment", "--sim", "--seed"], ["cluster", "status", "--controls"],
                                     ["demo", "--dashboard-port"], ["experiment", "--sim", "--duration"],
                                     ["demo", "--duration"], ["status", "--watch"]])
def test_number_options_of_commands_read_ascii_digits_only(command: list[str]) -> None:
    # Services on closed ports: had the check let the value through, the command would fail later, not on it.
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:1/0", MONGO_URI="mongodb://127.0.0.1:1/")
    done = run_scrapy([*command, "١"], env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"argument {command[-1]}: expected " in done.stderr and "got '١'" in done.stderr
