"""``scrapy cluster`` against a real scrapyd daemon, started the way docs/deploy.md tells an operator to.

The daemon runs on loopback with HTTP basic auth on a free port, from its own ``scrapyd.conf`` (SqliteJobStorage,
``max_proc`` for every long-running job), with ``REDIS_URL`` and ``MONGO_URI`` in its environment. Its Python has
the project's dependencies but not the project: the jobs run the uploaded egg, as on a crawl machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import FAST_PROFILE, run_scrapy
from test_cluster import all_done, assert_no_duplicates

from product_crawl.cluster import LocalCluster
from product_crawl.deploy.plan import name_of, parse_nodes, parse_settings, plan_jobs
from product_crawl.deploy.scrapyd import DeployError, Target, write_scrapyd_config
from product_crawl.services import free_port, generate_password
from product_crawl.simweb.corpus import corpus_size
from product_crawl.tasks import keywords_for

USER = "pc-operator"


@pytest.fixture
def scrapyd(tmp_path: Path, redis_url: str, mongo_uri: str, acl_users: dict[str, str]) -> Iterator[dict[str, Any]]:
    """A scrapyd daemon with credentials; every process it started is gone afterwards, even on failure.

    Its jobs reach Redis as the least-privilege node user of docs/deploy.md.
    """
    home = tmp_path / "scrapyd"
    env_dir = tmp_path / "scrapyd-env"
    # A Python environment with the dependencies only: the project itself comes from the egg.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    port, password = free_port(), generate_password()
    conf = write_scrapyd_config(home / "scrapyd.conf", port=port, username=USER, password=password, max_proc=8,
                                poll_interval=0.2)
    assert conf.stat().st_mode & 0o777 == 0o600
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "MONGO_URI")}
    env.update(REDIS_URL=acl_url(redis_url, acl_users["node"]), MONGO_URI=mongo_uri, PYTHONUNBUFFERED="1")
    with open(tmp_path / "scrapyd.log", "wb") as log:
        proc = subprocess.Popen([str(python), "-m", "scrapyd"], cwd=home, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/daemonstatus.json", auth=(USER, password), timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "scrapyd.log").read_text()
            time.sleep(0.2)
        yield {"url": url, "password": password, "home": home, "port": port}
    finally:
        # Jobs share scrapyd's process group: end them all, politely first.
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                time.sleep(0.5)  # jobs may outlive the daemon for a moment
            except subprocess.TimeoutExpired:
                pass


def acl_url(redis_url: str, user: str) -> str:
    return redis_url.replace("redis://", f"redis://{user}@")


def operator_env(tmp_path: Path, cluster: LocalCluster, scrapyd: dict[str, Any], password: str,
                 redis_user: str) -> dict[str, str]:
    """The operator's shell: targets in a user-level scrapy.cfg, passwords in the environment, Redis as a viewer."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(exist_ok=True)
    (xdg / "scrapy.cfg").write_text(
        "[deploy:t1]\n"
        f"url = {scrapyd['url']}/\n"
        "project = product_crawl\n"
        f"username = {USER}\n"
        "password = ${PC_SCRAPYD_PASSWORD}\n"
        "node_addresses = 127.0.0.2,127.0.0.3\n"
        "node_types = 0\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(xdg), PC_SCRAPYD_PASSWORD=password,
               REDIS_URL=acl_url(cluster.redis_url, redis_user),
               MONGO_URI=cluster.mongo_uri, PC_SERVICES_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    return env


def test_cluster_deploy_up_status_down_on_scrapyd(cluster: LocalCluster, scrapyd: dict[str, Any],
                                                  acl_users: dict[str, str], tmp_path: Path) -> None:
    env = operator_env(tmp_path, cluster, scrapyd, scrapyd["password"], acl_users["viewer"])
    keys = cluster.store.keys

    deployed = run_scrapy(["cluster", "deploy"], env)
    assert deployed.returncode == 0, deployed.stderr
    # four spiders: search, control, redis_search (the scrapy-redis peer of the experiment) and plain_search (the
    # cheapest crawler, which measures the machine)
    assert "deployed product_crawl version" in deployed.stdout and "4 spiders" in deployed.stdout

    cluster.start_simweb(FAST_PROFILE)
    # No recall within the test (the fixture's threshold is 4 s): the leased subtask below must go back to waiting
    # by the node's graceful stop, not by the control taking it back first.
    cluster.settings.update(CONCURRENT_REQUESTS_PER_DOMAIN=1, DOWNLOAD_DELAY=1, SCHEDEXT_RECALL_THRESHOLD=120)
    sets = [arg for name, value in cluster.settings.items()
            for arg in ("--set", f"{name}={json.dumps(value) if isinstance(value, dict) else value}")]
    up = run_scrapy(["cluster", "up", "--nodes", "t1=2", "--controls", "1", *sets], env)
    assert up.returncode == 0, up.stderr
    assert "t1-n1" in up.stdout and "t1-n2" in up.stdout and "t1-control" in up.stdout

    # Both nodes register under the ids from scrapy.cfg's target, bound to its addresses.
    def registered() -> dict[str, Any]:
        return {n["id"]: n for n in cluster.status()["nodes"] if n["alive"]}

    assert cluster.wait_for(lambda: set(registered()) == {"t1-n1", "t1-n2"}, 60), up.stdout
    assert {n["address"] for n in registered().values()} == {"127.0.0.2", "127.0.0.3"}
    prefix = ["-s", f"SCHEDEXT_PREFIX={cluster.prefix}"]  # the operator's commands use the jobs' prefix
    status = run_scrapy(["cluster", "status", "--json", *prefix], env)
    assert status.returncode == 0, status.stderr
    rows = {r["name"]: r for r in json.loads(status.stdout)["jobs"]}
    assert rows["t1-n1"]["alive"] is True and rows["t1-n2"]["state"] == "running"
    assert rows["t1-control"]["spider"] == "control" and rows["t1-n1"]["target"] == "t1"
    for row in rows.values():  # no secret (nor even the variable) in a job's command line
        cmdline = Path(f"/proc/{row['pid']}/cmdline").read_bytes()
        assert b"REDIS_URL" not in cmdline and b"MONGO_URI" not in cmdline and b"SCHEDEXT_NODE" in cmdline or \
            row["spider"] == "control"

    # One page at a time, a second apart: a subtask on slow.example takes several seconds, so it is still leased
    # when down arrives.
    products, sites = [("光明高钙牛奶", None), ("特仑苏", "蒙牛")], ["slow.example", "good.example"]
    cluster.inject([{"name": n, **({"brand": b} if b else {}), "sites": sites} for n, b in products])
    assert cluster.wait_for(lambda: cluster.items() > 0, 60)

    def leased_slow() -> bool:
        return any(json.loads(cluster.redis.hget(keys.subtasks, sid) or "{}").get("site") == "slow.example"
                   for sid in cluster.redis.zrange(keys.leases, 0, -1))

    assert cluster.wait_for(leased_slow, 60, interval=0.1)
    down = run_scrapy(["cluster", "down", "--timeout", "30", *prefix], env)
    assert down.returncode == 0, down.stderr
    assert "killed" not in down.stdout, down.stdout  # every job stopped gracefully
    assert "leased 0  in crawl queues 0" in down.stdout, down.stdout
    # Nothing is leased, nothing waits in a node's queue, nothing went to manual handling, no node is registered.
    assert not cluster.redis.zcard(keys.leases)
    assert not any(cluster.redis.llen(keys.crawl(n)) for n in ("t1-n1", "t1-n2"))
    assert not cluster.redis.hlen(keys.dead) and not cluster.redis.hlen(keys.nodes)
    assert not all_done(cluster)
    # The leased subtask went back to waiting, by the node's graceful stop (not by a recall: the control is gone).
    assert cluster.redis.zcard(keys.waiting) > 0
    logs = "".join(p.read_text() for p in (scrapyd["home"] / "logs").rglob("t1-n*.log"))
    assert "unfinished subtask(s) to waiting" in logs
    jobs = requests.get(f"{scrapyd['url']}/listjobs.json", auth=(USER, scrapyd["password"]), timeout=5).json()
    assert not jobs["running"] and not jobs["pending"]

    # A second up finishes the work: every page of every task, once.
    again = run_scrapy(["cluster", "up", "--nodes", "t1=2", "--controls", "1", *sets], env)
    assert again.returncode == 0, again.stderr
    # Meanwhile a rolling upgrade (docs/deploy.md): a new version, then one node at a time; the other keeps its job.
    assert cluster.wait_for(lambda: set(registered()) == {"t1-n1", "t1-n2"}, 60)
    v2 = run_scrapy(["cluster", "deploy", "--version", "2"], env)
    assert v2.returncode == 0 and "version 2 to t1" in v2.stdout, v2.stderr
    roll = run_scrapy(["cluster", "down", "--only", "t1-n1", "--timeout", "30", *prefix], env)
    assert roll.returncode == 0 and "t1-n1." in roll.stdout, roll.stderr
    assert "t1-n2." not in roll.stdout and "control." not in roll.stdout and "killed" not in roll.stdout
    assert "by t1-n1: leased 0  in crawl queues 0" in roll.stdout, roll.stdout  # its lease went back
    back = run_scrapy(["cluster", "up", "--nodes", "t1=2", "--controls", "1", *sets], env)
    lines = {line.split()[0]: line for line in back.stdout.splitlines()}
    assert "scheduled as job t1-n1." in lines["t1-n1"] and "already running" in lines["t1-n2"], back.stdout
    assert cluster.wait_for(lambda: all_done(cluster), 90, interval=1)
    assert cluster.items() == sum(corpus_size(keywords_for(n, b), s, 0, 40, 60) for n, b in products for s in sites)
    assert_no_duplicates(cluster)
    last = run_scrapy(["cluster", "down", "--timeout", "30", *prefix], env)
    assert last.returncode == 0 and "leased 0  in crawl queues 0" in last.stdout
    assert not cluster.redis.zcard(keys.leases)

    # No secret in the output of our commands, the jobs' logs or scrapyd's own log.
    shown = "".join(r.stdout + r.stderr for r in (deployed, up, status, down, again, v2, roll, back, last))
    logs = "".join(p.read_text(errors="replace") for p in (scrapyd["home"] / "logs").rglob("*.log"))
    logs += (tmp_path / "scrapyd.log").read_text(errors="replace")
    assert "no permissions" not in logs  # the jobs ran as the least-privilege user without a refusal
    for secret in (scrapyd["password"], *(u.split(":")[1] for u in acl_users.values())):
        assert secret not in shown and secret not in logs


def test_cluster_wrong_credentials_name_the_target(cluster: LocalCluster, scrapyd: dict[str, Any],
                                                   acl_users: dict[str, str], tmp_path: Path) -> None:
    env = operator_env(tmp_path, cluster, scrapyd, "not-the-password", acl_users["viewer"])
    for action in (["status"], ["deploy"]):
        done = run_scrapy(["cluster", *action], env)
        assert done.returncode == 1
        assert "target t1 (http://127.0.0.1:" in done.stderr and "refused the credentials" in done.stderr
        assert "not-the-password" not in done.stdout + done.stderr


# --- the plan, without services ---------------------------------------------------------------------------------

TARGETS = {"h11": Target("h11", "http://10.0.0.11:6800", "product_crawl", node_addresses=("10.0.0.11", "10.0.0.21")),
           "h12": Target("h12", "http://10.0.0.12:6800", "product_crawl", node_types="1")}


def test_plan_gives_each_node_its_id_and_address_and_places_control_and_standby() -> None:
    jobs = plan_jobs(parse_nodes("h11=2,h12=1", TARGETS), TARGETS, {"SCHEDEXT_PREFIX": "{pc}"})
    assert [(j.target, j.spider, j.name) for j in jobs] == [
        ("h11", "search", "h11-n1"), ("h11", "search", "h11-n2"), ("h12", "search", "h12-n1"),
        ("h11", "control", "h11-control"), ("h12", "control", "h12-standby")]
    assert jobs[1].settings == {"SCHEDEXT_PREFIX": "{pc}", "SCHEDEXT_NODE_ID": "h11-n2", "SCHEDEXT_NODE_TYPE": "0,1",
                                "SCHEDEXT_BIND_ADDRESS": "10.0.0.21"}
    assert "SCHEDEXT_BIND_ADDRESS" not in jobs[2].settings and jobs[2].settings["SCHEDEXT_NODE_TYPE"] == "1"
    assert jobs[3].settings["SCHEDEXT_CONTROL_ID"] == "h11-control"
    assert name_of("h11-n2.20261201T010203") == "h11-n2" and name_of("f00ba7") is None


@pytest.mark.parametrize(("nodes", "message"), [
    ("h11", "expected TARGET=N"), ("h13=1", "unknown target 'h13'; scrapy.cfg has: h11, h12"),
    ("h11=1,h11=2", "given twice"), ("h11=0", "at least one node"),
    ("h11=3", "target h11 has only 2 node_addresses"),
    # Digits str.isdigit takes but a count is not written with: int() refuses "²" and reads "١" as 1.
    ("h11=²", "expected TARGET=N"), ("h11=١", "expected TARGET=N"),
])
def test_plan_refuses_bad_node_counts(nodes: str, message: str) -> None:
    with pytest.raises(DeployError, match=message):
        plan_jobs(parse_nodes(nodes, TARGETS), TARGETS, {})


@pytest.mark.parametrize(("pair", "message"), [
    ("REDIS_URL=redis://:pw@h/0", "secrets never go in job settings"),
    ("PC_ORACLE=http://user:pw@h/", "secrets never go in job settings"),
    ("SCHEDEXT_NODE_ID=x", "set by scrapy cluster up"), ("lower=1", "upper-case setting name"),
])
def test_job_settings_refuse_secrets(pair: str, message: str) -> None:
    with pytest.raises(DeployError, match=message):
        parse_settings([pair])


def test_scrapyd_config_always_has_credentials(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="needs a username and a password"):
        write_scrapyd_config(tmp_path / "scrapyd.conf", port=6800, username="pc", password="")


def test_scrapyd_config_command_writes_a_private_config_with_a_generated_password(tmp_path: Path) -> None:
    done = run_scrapy(["cluster", "scrapyd-config", str(tmp_path / "sd"), "--port", "7299"])
    assert done.returncode == 0, done.stderr
    conf = tmp_path / "sd" / "scrapyd.conf"
    values = dict(line.split(" = ", 1) for line in conf.read_text().splitlines() if " = " in line)
    assert conf.stat().st_mode & 0o777 == 0o600
    assert values["bind_address"] == "127.0.0.1" and values["http_port"] == "7299"
    assert values["username"] == "pc-operator" and len(values["password"]) >= 24
    assert values["jobstorage"] == "scrapyd.jobstorage.SqliteJobStorage"
    assert values["password"] not in done.stdout + done.stderr
    again = run_scrapy(["cluster", "scrapyd-config", str(tmp_path / "sd")])
    assert again.returncode == 1 and "already exists" in again.stderr
    assert conf.read_text().count(values["password"]) == 1  # not overwritten


def _cluster_options(argv: list[str]) -> Any:
    """``scrapy cluster``'s options parsed the way scrapy.cmdline parses them (its parser, its conflict handler)."""
    from scrapy.cmdline import ScrapyArgumentParser
    from scrapy.settings import Settings

    from product_crawl.commands.cluster import Command

    command = Command()
    command.settings = Settings()
    parser = ScrapyArgumentParser(conflict_handler="resolve")
    command.add_options(parser)
    return parser.parse_args(argv)


def test_cluster_set_is_for_jobs_and_scrapy_s_for_the_command() -> None:
    opts = _cluster_options(["-s", "REDIS_URL=redis://:pw@h/0", "--set", "SCHEDEXT_PREFIX={pc}", "--set=A=1"])
    assert opts.set == ["REDIS_URL=redis://:pw@h/0"]  # Scrapy's own -s: the command's settings, not a job's
    assert opts.job_settings == ["SCHEDEXT_PREFIX={pc}", "A=1"]


def _one_target_env(tmp_path: Path) -> dict[str, str]:
    """A user-level scrapy.cfg with one target on a closed port: commands fail before they reach it, or say so."""
    (tmp_path / "scrapy.cfg").write_text("[deploy:t1]\nurl = http://127.0.0.1:1/\nproject = product_crawl\n"
                                         "username = pc-operator\npassword = not-a-secret\n")
    return dict(os.environ, XDG_CONFIG_HOME=str(tmp_path))


def test_cluster_up_names_a_bad_set_pair(tmp_path: Path) -> None:
    done = run_scrapy(["cluster", "up", "--nodes", "t1=1", "--set", "FOO"], _one_target_env(tmp_path))
    assert done.returncode == 1
    assert done.stderr == "error: --set: expected NAME=VALUE with an upper-case setting name, got 'FOO'\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "-5"], "argument --port: expected a TCP port 1 .. 65535, got '-5'"),
    (["--port", "99999999"], "argument --port: expected a TCP port 1 .. 65535, got '99999999'"),
    (["--port", "0"], "argument --port: expected a TCP port 1 .. 65535, got '0'"),
    (["--max-proc", "0"], "argument --max-proc: expected a whole number of jobs >= 1, got '0'"),
    (["--max-proc", "-3"], "argument --max-proc: expected a whole number of jobs >= 1, got '-3'"),
    (["--bind", ""], "argument --bind: expected an IP address to listen on (e.g. 127.0.0.1, 0.0.0.0 or ::), got ''"),
])
def test_scrapyd_config_refuses_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_scrapy(["cluster", "scrapyd-config", str(tmp_path / "sd"), *args])
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "sd").exists()


def test_scrapyd_config_refuses_a_file_for_its_folder(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text("<html></html>")
    done = run_scrapy(["cluster", "scrapyd-config", str(page)])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"DIR {str(page)!r}: expected a folder (new or existing) for scrapyd.conf" in done.stderr
    below = run_scrapy(["cluster", "scrapyd-config", str(page / "sd")])
    assert below.returncode == 1 and "Traceback" not in below.stderr
    assert f"DIR {str(page / 'sd')!r}: cannot write scrapyd.conf there: Not a directory" in below.stderr


@pytest.mark.parametrize("timeout", ["nan", "-1", "inf"])
def test_cluster_down_refuses_a_timeout_that_is_not_finite_seconds(tmp_path: Path, timeout: str) -> None:
    done = run_scrapy(["cluster", "down", f"--timeout={timeout}"], _one_target_env(tmp_path))
    assert done.returncode == 2
    assert f"argument --timeout: expected a number of seconds >= 0 and <= 86400, got {timeout!r}" in done.stderr
    assert "cannot reach scrapyd" not in done.stderr  # refused before any target is asked
