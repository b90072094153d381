"""scrapyd targets, its JSON API, the project's egg, and a scrapyd configuration with credentials.

Targets are the ``[deploy]`` and ``[deploy:NAME]`` sections of ``scrapy.cfg``, read the way ``scrapyd-deploy``
reads them (scrapyd-client's parser: the same files, ``${VAR}`` expanded from the environment, ``.netrc`` as a
fallback for credentials), so one file serves both tools. On top of scrapyd-client's keys (``url``, ``project``,
``username``, ``password``) a target may carry:

``node_addresses``
    comma-separated source addresses of this machine, one per crawl node (``SCHEDEXT_BIND_ADDRESS``); node ``i`` of
    the target gets the ``i``-th. Empty: the nodes use the machine's default address.
``node_types``
    ``SCHEDEXT_NODE_TYPE`` of the target's nodes (default ``0,1``).

Credentials never come from the command line: a command-line argument is visible in ``ps`` to every user.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Target names become parts of node ids and job ids: keep them to letters, digits, ``_`` and ``-``.
TARGET_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,40}")
NODE_TYPES_RE = re.compile(r"[01](,[01])?")


class DeployError(RuntimeError):
    """Raised if a scrapyd target cannot be used or refuses a request; the message names the target."""


@dataclass(frozen=True)
class Target:
    """One scrapyd daemon, as ``scrapy.cfg`` describes it."""

    name: str
    url: str
    project: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never printed
    node_addresses: tuple[str, ...] = ()
    node_types: str = "0,1"

    def describe(self) -> str:
        """``NAME (URL)`` for messages; the URL without any user info."""
        return f"{self.name} ({_strip_userinfo(self.url)})"


def _strip_userinfo(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//", url)


def read_targets() -> dict[str, Target]:
    """Every target of the scrapy.cfg files in force, by name (``default`` for a bare ``[deploy]`` with a url).

    Raises :class:`DeployError` naming the section for a bad target name or a missing url.
    """
    try:  # imported here: scrapyd-client is the optional `deploy` extra
        from scrapyd_client.utils import get_auth, get_config
    except ImportError as exc:
        raise DeployError("scrapyd-client is not installed: pip install 'product_crawl[deploy]'") from exc

    cfg = get_config()
    base = dict(cfg.items("deploy")) if cfg.has_section("deploy") else {}
    raw: dict[str, dict[str, str]] = {}
    if "url" in base:
        raw["default"] = base
    for section in cfg.sections():
        if section.startswith("deploy:"):
            raw[section[len("deploy:"):]] = {**base, **dict(cfg.items(section))}
    targets = {}
    for name, values in raw.items():
        section = "deploy" if name == "default" else f"deploy:{name}"
        if not TARGET_NAME_RE.fullmatch(name):
            raise DeployError(f"[{section}] in scrapy.cfg: a target name is letters, digits, '_' and '-' "
                              f"(at most 40), got {name!r}")
        if not values.get("url"):
            raise DeployError(f"[{section}] in scrapy.cfg: no url")
        if not NODE_TYPES_RE.fullmatch(values.get("node_types", "0,1").replace(" ", "")):
            raise DeployError(f"[{section}] in scrapy.cfg: node_types: expected 0, 1 or 0,1, got "
                              f"{values['node_types']!r}")
        url = values["url"].rstrip("/")
        auth = get_auth(url=url, username=values.get("username", ""), password=values.get("password", ""))
        targets[name] = Target(
            name=name, url=url, project=values.get("project") or "product_crawl",
            username=auth.username if auth else None, password=auth.password if auth else None,
            node_addresses=tuple(a.strip() for a in values.get("node_addresses", "").split(",") if a.strip()),
            node_types=values.get("node_types", "0,1").replace(" ", ""),
        )
    return targets


class ScrapydClient:
    """scrapyd's JSON API on one target. Every failure is a :class:`DeployError` that names the target."""

    def __init__(self, target: Target, timeout: float = 30.0) -> None:
        self.target = target
        self.timeout = timeout

    def _call(self, method: str, endpoint: str, **kwargs: Any) -> dict[str, Any]:
        import requests

        t = self.target
        auth = (t.username, t.password or "") if t.username else None
        try:
            response = requests.request(method, f"{t.url}/{endpoint}.json", auth=auth, timeout=self.timeout,
                                        **kwargs)
        except requests.RequestException as exc:  # refused, unreachable, timed out
            raise DeployError(f"target {t.describe()}: cannot reach scrapyd: {exc}") from exc
        if response.status_code == 401:
            where = "deploy" if t.name == "default" else f"deploy:{t.name}"
            raise DeployError(
                f"target {t.describe()} refused the credentials (HTTP 401 Unauthorized); set username and "
                f"password in [{where}] of scrapy.cfg, e.g. password = ${{PC_SCRAPYD_PASSWORD}} from the "
                f"environment" + ("" if t.username else " (none are set)"))
        try:
            data = response.json()
        except ValueError as exc:  # an HTML error page, a proxy, not scrapyd at all
            raise DeployError(f"target {t.describe()}: {endpoint}.json answered HTTP {response.status_code} with "
                              f"no JSON: {response.text[:200]!r}") from exc
        if not isinstance(data, dict) or data.get("status") != "ok":
            message = data.get("message") if isinstance(data, dict) else data
            raise DeployError(f"target {t.describe()}: {endpoint}.json failed: {message}")
        return data

    def daemonstatus(self) -> dict[str, Any]:
        return self._call("GET", "daemonstatus")

    def add_version(self, version: str, egg: bytes) -> int:
        """Upload the egg as ``version`` of the target's project; returns the number of spiders scrapyd found."""
        data = self._call("POST", "addversion", data={"project": self.target.project, "version": version},
                          files={"egg": ("project.egg", egg)})
        return int(data.get("spiders", 0))

    def schedule(self, spider: str, jobid: str, settings: dict[str, str]) -> str:
        payload = [("project", self.target.project), ("spider", spider), ("jobid", jobid)]
        payload += [("setting", f"{name}={value}") for name, value in settings.items()]
        return str(self._call("POST", "schedule", data=payload)["jobid"])

    def listjobs(self) -> dict[str, list[dict[str, Any]]]:
        """``pending``, ``running`` and ``finished`` jobs of the project (empty lists if it has none yet)."""
        try:
            data = self._call("GET", "listjobs", params={"project": self.target.project})
        except DeployError as exc:
            if "not found" in str(exc):  # nothing deployed or scheduled there yet
                return {"pending": [], "running": [], "finished": []}
            raise
        return {state: list(data.get(state) or []) for state in ("pending", "running", "finished")}

    def cancel(self, jobid: str, signal: str = "INT") -> str | None:
        """Cancel a job: a pending one is removed, a running one gets ``signal``. Returns its previous state."""
        data = self._call("POST", "cancel", data={"project": self.target.project, "job": jobid, "signal": signal})
        return data.get("prevstate")


# --- the egg ------------------------------------------------------------------------------------------------------


def build_egg(project_dir: Path) -> bytes:
    """Build the project's egg from its own ``setup.py`` (a shim over pyproject.toml); returns its bytes.

    Build files go to a temporary folder, so the checkout stays clean. The egg carries the code, the package data
    and the ``scrapy`` entry point (``settings = product_crawl.settings``), not the dependencies.
    """
    with tempfile.TemporaryDirectory(prefix="pc-egg-") as tmp:
        argv = [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", tmp, "build", "--build-base",
                f"{tmp}/build", "bdist_egg", "--bdist-dir", f"{tmp}/bdist", "-d", f"{tmp}/dist"]
        done = subprocess.run(argv, cwd=project_dir, capture_output=True, text=True)
        eggs = sorted(Path(tmp, "dist").glob("*.egg"))
        if done.returncode != 0 or not eggs:
            raise DeployError(f"building the egg in {project_dir} failed (exit {done.returncode}): "
                              f"{done.stderr[-800:]}")
        return eggs[0].read_bytes()


# --- a scrapyd daemon with credentials --------------------------------------------------------------------------


def write_scrapyd_config(path: Path, *, port: int, username: str, password: str, bind_address: str = "127.0.0.1",
                         max_proc: int = 16, poll_interval: float = 1.0) -> Path:
    """Write a ``scrapyd.conf`` (mode 0600) for a daemon whose data lives beside it, and return its path.

    Credentials are required: scrapyd without them runs any egg anyone on the network uploads. Jobs are kept in
    SQLite (``SqliteJobStorage``) so ``scrapy cluster status`` sees finished jobs across restarts of the daemon,
    and ``max_proc`` must cover every long-running node and control of the machine.
    """
    if not username or not password:
        raise DeployError(f"{path}: scrapyd needs a username and a password (it runs the code it is sent)")
    if "\n" in username + password:
        raise DeployError(f"{path}: username and password must be one line each")
    base = path.parent.resolve()
    text = "\n".join([
        "[scrapyd]",
        f"bind_address = {bind_address}",
        f"http_port = {port}",
        f"username = {username}",
        f"password = {password}",
        "jobstorage = scrapyd.jobstorage.SqliteJobStorage",
        f"max_proc = {max_proc}",
        f"poll_interval = {poll_interval}",
        f"eggs_dir = {base / 'eggs'}",
        f"logs_dir = {base / 'logs'}",
        f"dbs_dir = {base / 'dbs'}",
        "items_dir =",
        "",
    ])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)
    return path
