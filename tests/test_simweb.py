"""Tests of product_crawl.simweb against a real server: the simulated web runs in a subprocess on port 0 and
is queried over HTTP from different loopback source addresses, and its pages are read with the real engine
parsers. The test profile has (near) zero latencies so the module stays fast; time-dependent behaviour
(phases) is tested through the pure :meth:`Profile.behaviour`."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from scrapy.http import HtmlResponse

from product_crawl.engines import Engine, get_engine
from product_crawl.simweb import (
    LISTENING_PREFIX,
    ProfileError,
    SimWebProcess,
    corpus_size,
    document,
    load_profile,
    parse_profile,
)

PROJECT = Path(__file__).resolve().parent.parent
WORDS = ["光明", "高钙", "牛奶"]
NODE1, NODE4 = "127.0.0.2", "127.0.0.5"

TEST_PROFILE: dict[str, Any] = {
    "name": "test",
    "corpus": {"min": 25, "max": 45},
    "default": {"share": 0.5, "latency": {"mean": 0, "spread": 0}, "error_rate": 0, "block_rate": 0},
    "nodes": {
        NODE1: {
            "label": "node1",
            "sites": {
                "12315.com": {"share": 1.0},
                "weibo.com": {"share": 1.0},
                "blocked.example": {"block_rate": 1.0},
                "down.example": {"error_rate": 1.0},
                "slow.example": {"latency": {"mean": 0.4, "spread": 0}},
            },
        },
        NODE4: {"label": "node4", "share": 0.1},
    },
}


@pytest.fixture(scope="module")
def simweb(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("simweb") / "test-profile.json"
    path.write_text(json.dumps(TEST_PROFILE), encoding="utf-8")
    with SimWebProcess(path, seed=7) as web:
        yield web.url


@pytest.fixture(scope="module")
def engines(simweb: str) -> dict[str, Engine]:
    settings = {"PC_ENGINE_BASE_URLS": {"baidu": simweb, "weibo": simweb}}
    return {"baidu": get_engine("baidu", settings), "weibo": get_engine("weibo", settings)}


def fetch(url: str, source: str = "127.0.0.1") -> tuple[int, HtmlResponse]:
    """GET ``url`` from the loopback address ``source``; the body wrapped as Scrapy would see it."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", f"{parts.path}?{parts.query}" if parts.query else parts.path)
        resp = conn.getresponse()
        body = resp.read()
        headers = {"Content-Type": resp.getheader("Content-Type", "text/html")}
        return resp.status, HtmlResponse(url=url, body=body, headers=headers)
    finally:
        conn.close()


def fetch_json(url: str) -> Any:
    status, resp = fetch(url)
    assert status == 200
    return json.loads(resp.body)


# --- served pages -------------------------------------------------------------------------------------------


def test_nodes_see_the_same_count_but_different_shares(engines: dict[str, Engine]):
    baidu = engines["baidu"]
    pages = {NODE1: [], NODE4: []}
    for source in pages:
        for number in range(2):
            status, resp = fetch(baidu.page_url(WORDS, "12315.com", number), source)
            assert status == 200 and not baidu.is_blocked(resp)
            pages[source].append(baidu.parse(resp))
    reported = {p.reported for ps in pages.values() for p in ps}
    assert len(reported) == 1 and 25 <= reported.pop() <= 45
    ranks1 = [r.rank for p in pages[NODE1] for r in p.results]
    ranks4 = [r.rank for p in pages[NODE4] for r in p.results]
    assert ranks1 == list(range(1, 21))  # node 1 is served everything
    assert len(ranks4) < 10 and set(ranks4) <= set(ranks1)
    # The same node re-crawling a page is served the same subset.
    _, again = fetch(baidu.page_url(WORDS, "12315.com", 0), NODE4)
    assert baidu.parse(again).results == pages[NODE4][0].results
    first = pages[NODE1][0].results[0]
    assert first.url.startswith("http://12315.com/") and first.title and first.snippet and first.date


def test_pagination_ends_without_next_link(simweb: str, engines: dict[str, Engine]):
    baidu = engines["baidu"]
    wd = "光明 高钙 牛奶 site:cca.org.cn"
    total = fetch_json(f"{simweb}/_truth?engine=baidu&wd={quote(wd)}")["total"]
    assert total == corpus_size(WORDS, "cca.org.cn", seed=7, low=25, high=45)
    last = baidu.pages_for(total) - 1
    # Node 1 has no entry for cca.org.cn: the default (share 0.5) applies; check the links and the ranks.
    _, resp = fetch(baidu.page_url(WORDS, "cca.org.cn", last - 1), NODE1)
    assert baidu.parse(resp).has_next
    _, resp = fetch(baidu.page_url(WORDS, "cca.org.cn", last), NODE1)
    page = baidu.parse(resp)
    assert (page.reported, page.has_next) == (total, False)
    assert all(last * 10 < r.rank <= total for r in page.results)
    _, resp = fetch(baidu.page_url(WORDS, "cca.org.cn", last + 1), NODE1)
    assert baidu.parse(resp) == type(page)(results=[], reported=total, has_next=False)


def test_weibo_pages(engines: dict[str, Engine]):
    weibo = engines["weibo"]
    first = weibo.parse(fetch(weibo.page_url(WORDS, "weibo.com", 0), NODE1)[1])
    assert first.reported == corpus_size([*WORDS, "投诉"], "weibo.com", seed=7, low=25, high=45)
    assert [r.rank for r in first.results] == list(range(1, 11)) and first.has_next
    assert first.results[0].url.startswith("http://weibo.com/") and first.results[0].date
    last = weibo.pages_for(first.reported) - 1
    page = weibo.parse(fetch(weibo.page_url(WORDS, "weibo.com", last), NODE1)[1])
    assert not page.has_next and len(page.results) == weibo.offered(first.reported, last)


def test_errors_and_captchas(engines: dict[str, Engine]):
    baidu, weibo = engines["baidu"], engines["weibo"]
    status, resp = fetch(baidu.page_url(WORDS, "blocked.example", 0), NODE1)
    assert status == 200 and baidu.is_blocked(resp) and baidu.parse(resp).results == []
    status, resp = fetch(weibo.page_url(WORDS, "blocked.example", 0), NODE1)
    assert status == 200 and weibo.is_blocked(resp)
    status, _ = fetch(baidu.page_url(WORDS, "down.example", 0), NODE1)
    assert status == 503
    status, _ = fetch(f"{baidu.base_url}/s?pn=0")
    assert status == 400


def test_latency_does_not_block_other_requests(simweb: str, engines: dict[str, Engine]):
    baidu = engines["baidu"]
    done: dict[str, float] = {}
    busy = fetch_json(f"{simweb}/_counters")["busy_ms"].get(NODE1, 0)
    start = time.monotonic()

    def slow() -> None:
        fetch(baidu.page_url(WORDS, "slow.example", 0), NODE1)
        done["slow"] = time.monotonic() - start

    thread = threading.Thread(target=slow)
    thread.start()
    fetch(baidu.page_url(WORDS, "12315.com", 0), NODE1)
    done["fast"] = time.monotonic() - start
    thread.join(5)
    assert done["slow"] >= 0.4 and done["fast"] < done["slow"]
    # The time the node's requests were in flight here: the slow one's 0.4 s, the fast one's nearly nothing.
    assert 400 <= fetch_json(f"{simweb}/_counters")["busy_ms"][NODE1] - busy < 1000


def test_truth_and_counters(simweb: str, engines: dict[str, Engine]):
    fetch(engines["baidu"].page_url(["蒙牛", "特仑苏"], "12315.com", 0), NODE1)
    truth = fetch_json(f"{simweb}/_truth")
    assert truth["profile"]["name"] == "test"
    assert truth["profile"]["nodes"][NODE1]["label"] == "node1"
    assert truth["profile"]["corpus"] == {"min": 25, "max": 45}
    assert truth["seed"] == 7 and truth["elapsed"] >= 0 and truth["started_at"] <= time.time()
    entry = next(e for e in truth["corpus"] if e["query"] == "site:12315.com 蒙牛 特仑苏")
    assert entry == {
        "engine": "baidu",
        "query": "site:12315.com 蒙牛 特仑苏",
        "words": ["蒙牛", "特仑苏"],
        "site": "12315.com",
        "total": corpus_size(["蒙牛", "特仑苏"], "12315.com", 7, 25, 45),
    }
    one = fetch_json(f"{simweb}/_truth?engine=weibo&q={quote('site:weibo.com 蒙牛&投诉')}")
    assert one["total"] == corpus_size(["蒙牛", "投诉"], "weibo.com", 7, 25, 45)
    counters = fetch_json(f"{simweb}/_counters")
    node1 = counters["by_site"][NODE1]["12315.com"]
    assert node1["requests"] >= 1 and node1["ok"] >= 1 and node1["results"] >= 10
    assert counters["by_address"][NODE1]["requests"] >= node1["requests"]
    assert counters["labels"][NODE1] == "node1"


# --- profiles -----------------------------------------------------------------------------------------------


def _profile(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(TEST_PROFILE))
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _profile(nodes={NODE1: {"sites": {"12315.com": {"share": 1.5}}}}),
            f"nodes.{NODE1}.sites.12315.com.share: expected a number in [0, 1], got 1.5",
        ),
        (_profile(nodes={"node-one": {}}), "nodes.node-one: expected an IP address"),
        (
            _profile(nodes={NODE1: {"latency": {"mean": -0.1}}}),
            f"nodes.{NODE1}.latency.mean: expected a number in [0, 600], got -0.1",
        ),
        (
            _profile(nodes={NODE1: {"phases": [{"after": 50, "share": 0.1}, {"after": 40, "share": 0.2}]}}),
            f"nodes.{NODE1}.phases[1].after: expected phases sorted",
        ),
        (_profile(nodes={NODE1: {"phases": [{"share": 0.1}]}}), f"nodes.{NODE1}.phases[0].after: missing"),
        (_profile(nodes={NODE1: {"sahre": 0.1}}), f"nodes.{NODE1}.sahre: unknown field"),
        (_profile(default={"share": 0.3}), "default.latency: missing required field"),
        (_profile(corpus={"min": 50, "max": 10}), "corpus.max: expected an integer >= corpus.min"),
        (_profile(nodes={NODE1: {"error_rate": True}}), f"nodes.{NODE1}.error_rate: expected a number"),
        (  # a request would wait that long: the crawl hangs
            _profile(default={**TEST_PROFILE["default"], "latency": {"mean": 1e308}}),
            "default.latency.mean: expected a number in [0, 600], got 1e+308",
        ),
        (
            _profile(nodes={NODE1: {"latency": {"mean": 1, "spread": 601}}}),
            f"nodes.{NODE1}.latency.spread: expected a number in [0, 600], got 601",
        ),
        (
            _profile(nodes={NODE1: {"phases": [{"after": 1e308, "share": 0.1}]}}),
            f"nodes.{NODE1}.phases[0].after: expected a number in [0, 604800], got 1e+308",
        ),
    ],
)
def test_bad_profiles_name_the_field(data: dict[str, Any], message: str):
    with pytest.raises(ProfileError) as info:
        parse_profile(data, "profile file 'x.json'")
    assert str(info.value).startswith("profile file 'x.json': ")
    assert message in str(info.value)


def test_bad_profile_file_is_refused_by_both_launchers(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(_profile(nodes={NODE1: {"sites": {"12315.com": {"share": 1.5}}}})), encoding="utf-8"
    )
    for argv in ([sys.executable, "-m", "product_crawl.simweb"], [sys.executable, "-m", "scrapy", "simweb"]):
        proc = subprocess.run(
            [*argv, "--profile", str(bad)], cwd=PROJECT, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 1, proc.stderr
        assert f"nodes.{NODE1}.sites.12315.com.share" in proc.stderr and str(bad) in proc.stderr
        assert proc.stdout == ""
    for argv in ([sys.executable, "-m", "product_crawl.simweb"], [sys.executable, "-m", "scrapy", "simweb"]):
        proc = subprocess.run([*argv, "--port", "99999"], cwd=PROJECT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--port: expected a TCP port 0 .. 65535" in proc.stderr, proc.stderr
    not_json = tmp_path / "broken.json"
    not_json.write_text("{", encoding="utf-8")
    with pytest.raises(ProfileError, match="broken.json.*not valid JSON"):
        load_profile(not_json)
    with pytest.raises(RuntimeError, match="not valid JSON"):
        SimWebProcess(not_json).start()


def test_empty_host_is_refused_by_both_launchers():
    # Twisted takes an empty interface as every interface; the simulated web is for loopback.
    for argv in ([sys.executable, "-m", "product_crawl.simweb"], [sys.executable, "-m", "scrapy", "simweb"]):
        proc = subprocess.run([*argv, "--host", ""], cwd=PROJECT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert "argument --host: expected an address to listen on, such as 127.0.0.1" in proc.stderr, proc.stderr


def test_scrapy_simweb_command_prints_the_url(tmp_path: Path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scrapy",
            "simweb",
            "--profile",
            "paper",
            "--port",
            "0",
            "--seed",
            "3",
            "--nolog",
        ],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith(LISTENING_PREFIX + "http://127.0.0.1:")
        truth = fetch_json(f"{line[len(LISTENING_PREFIX) :]}/_truth")
        assert truth["profile"]["name"] == "paper" and truth["seed"] == 3
    finally:
        proc.terminate()
        proc.wait(10)


def test_phases_and_layers_resolve_by_elapsed_time():
    paper = load_profile("paper")
    # Figure 4: t.163.com is good for node 1 at first, then bad; node 2 stays good; unknown nodes get default.
    early, late = paper.behaviour(NODE1, "t.163.com", 0), paper.behaviour(NODE1, "t.163.com", 60)
    assert early.share >= 0.9 and late.share <= 0.3 and late.latency.mean > early.latency.mean
    assert paper.behaviour("127.0.0.3", "t.163.com", 600).share >= 0.9
    assert (
        paper.behaviour("127.0.0.4", "12315.com", 39.9).share
        >= 0.9
        > paper.behaviour("127.0.0.4", "12315.com", 40).share
    )
    assert paper.behaviour("127.0.0.9", "12315.com", 0).share == 0.3
    assert paper.label(NODE4) == "node4" and paper.label("127.0.0.9") == "127.0.0.9"


def test_paper_profile_rewards_good_routing():
    """Routed to the best node, each site yields >= 1.5x what a node picked blindly yields (steady state)."""
    paper = load_profile("paper")
    nodes = sorted(paper.nodes)
    assert [paper.label(a) for a in nodes] == ["node1", "node2", "node3", "node4"]
    suited = {
        "node1": {"12315.com", "315tousu.org"},
        "node2": {"12315.com", "t.163.com"},
        "node3": {"315tousu.org", "t.163.com"},
        "node4": {"cca.org.cn", "weibo.com"},
    }
    for site in ("12315.com", "315tousu.org", "t.163.com", "cca.org.cn", "weibo.com"):
        # results per second of crawling: share of a page kept, over the time a page takes
        rates, good = {}, set()
        for address in nodes:
            b = paper.behaviour(address, site, 3600)
            rates[paper.label(address)] = b.share * (1 - b.error_rate - b.block_rate) / b.latency.mean
            if b.share >= 0.9 and b.latency.mean <= 0.2 and b.error_rate + b.block_rate <= 0.02:
                good.add(paper.label(address))
        assert good == {n for n in suited if site in suited[n]}
        assert site in suited[max(rates, key=rates.__getitem__)]
        assert max(rates.values()) >= 1.5 * sum(rates.values()) / len(rates)


def test_corpus_is_deterministic_and_in_range():
    sizes = {corpus_size(WORDS, "12315.com", seed) for seed in range(20)}
    assert len(sizes) > 1 and all(300 <= n <= 3000 for n in sizes)
    assert corpus_size(WORDS, "12315.com", 1) == corpus_size(WORDS, "12315.com", 1)
    urls = {document(WORDS, "12315.com", 1, i).url for i in range(100)}
    assert len(urls) == 100
    assert document(WORDS, "12315.com", 1, 5) == document(WORDS, "12315.com", 1, 5)
    assert document(WORDS, "12315.com", 1, 5).url != document(WORDS, "cca.org.cn", 1, 5).url


def test_deep_pages_keep_every_result():
    # Past page 300 of a query the simulated Baidu numbers its results 3001..; the parser must not take them for
    # ads (which Baidu numbers from 3001 on the first pages): a large corpus is crawled to its end.
    from product_crawl.simweb.server import _baidu_page

    baidu = get_engine("baidu")
    for page in (0, 299, 300, 650):
        offset = page * 10
        docs = [document(WORDS, "12315.com", 7, i) for i in range(offset, offset + 10)]
        body = _baidu_page("光明 高钙 牛奶 site:12315.com", 8000, offset, docs, True)
        parsed = baidu.parse(HtmlResponse(url=baidu.page_url(WORDS, "12315.com", page), body=body, encoding="utf-8"))
        assert [r.rank for r in parsed.results] == list(range(offset + 1, offset + 11)), page
