"""A throwaway PostgreSQL server on loopback, from the installed server binaries (Debian's
``postgresql`` package): for the distributed tests and benchmarks/distributed.py."""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def server_binaries() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


@contextlib.contextmanager
def local_server(binaries: Path):
    """Yield the URL of a fresh database on a new server; the server and its files are gone after."""
    folder = Path(tempfile.mkdtemp(prefix="autoprec-pg-"))
    os.chmod(folder, 0o755)
    run_as = []
    if os.geteuid() == 0:  # the server refuses to run as root: Debian's package made a postgres user
        shutil.chown(folder, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = folder / "data"
    # AUTOPREC_PG_LIBS: a folder of the server's own shared libraries, for binaries carried to a machine
    # that lacks them (see docs/workers.md); given to the server's processes only.
    env = dict(os.environ)
    if os.environ.get("AUTOPREC_PG_LIBS"):
        env["LD_LIBRARY_PATH"] = os.environ["AUTOPREC_PG_LIBS"]
    subprocess.run([*run_as, str(binaries / "initdb"), "-D", str(data), "-U", "autoprec", "--auth=trust"],
                   check=True, capture_output=True, env=env)
    subprocess.run([*run_as, str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
                    "-o", f"-h 127.0.0.1 -p {port} -k {folder}", "start"], check=True, capture_output=True, env=env)
    try:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=port, user="autoprec", dbname="postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE autoprec")
        yield f"postgresql://autoprec@127.0.0.1:{port}/autoprec"
    finally:
        subprocess.run(
            [*run_as, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            env=env,
        )
        shutil.rmtree(folder, ignore_errors=True)
